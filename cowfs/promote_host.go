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

// hostDir performs file operations beneath a directory fd, never
// following a symlink and never leaving the directory, with no limit on
// path length.
type hostDir struct {
	fd   int
	name string
}

// walkBytes bounds the names one openat2 resolves, below PATH_MAX.
const walkBytes = 2048

// openDir opens directory p ("" is the top) beneath h. The kernel
// resolves the names, up to walkBytes of them per call, refusing any
// symlink and anything outside h: one system call for most paths, where
// one openat per name made a promotion of deep trees quadratic in system
// calls (4,000 changes 2,500 levels deep took 51 s).
func (h *hostDir) openDir(p string) (int, error) {
	fd, err := unix.FcntlInt(uintptr(h.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil || p == "" {
		return fd, err
	}
	how := &unix.OpenHow{Flags: unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for rest := p; rest != ""; {
		part := rest
		if len(part) > walkBytes {
			i := strings.LastIndexByte(part[:walkBytes], '/')
			if i <= 0 {
				i = strings.IndexByte(part, '/')
			}
			if i > 0 {
				part = part[:i]
			}
		}
		rest = strings.TrimPrefix(rest[len(part):], "/")
		if err := checkNames(part); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("promote: refusing path %q", p)
		}
		next, err := unix.Openat2(fd, part, how)
		unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", path.Join(h.name, p), err)
		}
		fd = next
	}
	return fd, nil
}

// checkNames refuses a slash-separated path with an empty, "." or ".."
// name: every path a promotion writes names its entries plainly.
func checkNames(p string) error {
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			return errors.New("not a plain path")
		}
	}
	return nil
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
