package cowfs

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// tmpSeq numbers the temporary names a promotion writes under.
var tmpSeq atomic.Uint64

// hostDir performs file operations beneath a directory fd, opening one
// name at a time and never following a symlink, so no path length limit
// applies and nothing can lead outside the directory.
type hostDir struct {
	fd   int
	name string
}

// openDir opens directory p ("" is the top) beneath h.
func (h *hostDir) openDir(p string) (int, error) {
	fd, err := unix.FcntlInt(uintptr(h.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil || p == "" {
		return fd, err
	}
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			unix.Close(fd)
			return -1, fmt.Errorf("promote: refusing path %q", p)
		}
		next, err := unix.Openat(fd, part, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", path.Join(h.name, p), err)
		}
		fd = next
	}
	return fd, nil
}

// parent opens the directory holding p and returns it with p's last name.
func (h *hostDir) parent(p string) (int, string, error) {
	name := path.Base(p)
	if p == "" || name == "." || name == ".." || strings.HasSuffix(p, "/") {
		return -1, "", fmt.Errorf("promote: refusing path %q", p)
	}
	fd, err := h.openDir(parentOf(p))
	return fd, name, err
}

func (h *hostDir) lstat(p string, st *unix.Stat_t) error {
	d, name, err := h.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	if err := unix.Fstatat(d, name, st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s: %w", path.Join(h.name, p), err)
	}
	return nil
}

func (h *hostDir) readlink(p string) (string, error) {
	d, name, err := h.parent(p)
	if err != nil {
		return "", err
	}
	defer unix.Close(d)
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(d, name, buf)
	if err != nil {
		return "", fmt.Errorf("readlink %s: %w", path.Join(h.name, p), err)
	}
	return string(buf[:n]), nil
}

func (h *hostDir) open(p string, flags int, mode uint32) (int, error) {
	d, name, err := h.parent(p)
	if err != nil {
		return -1, err
	}
	defer unix.Close(d)
	fd, err := unix.Openat(d, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path.Join(h.name, p), err)
	}
	return fd, nil
}

func (h *hostDir) list(p string) ([]string, error) {
	fd, err := h.openDir(p)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(fd), path.Join(h.name, p))
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.Name(), err)
	}
	return names, nil
}

func (h *hostDir) remove(p string, isDir bool) error {
	d, name, err := h.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	flags := 0
	if isDir {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(d, name, flags); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", path.Join(h.name, p), err)
	}
	return nil
}

// mkdir creates directory p private to the promoting user; it gets its
// mode once its contents are in.
func (h *hostDir) mkdir(p string) error {
	d, name, err := h.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	if err := unix.Mkdirat(d, name, 0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", path.Join(h.name, p), err)
	}
	return nil
}
