package cowfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrConflict reports that a host directory no longer matches the snapshot
// a promotion starts from, so applying the changes would lose someone's
// work.
var ErrConflict = errors.New("host directory changed since the base snapshot")

// Conflict is one path whose state on the host is not what the base
// snapshot says.
type Conflict struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// PromoteResult says what a promotion found and did.
type PromoteResult struct {
	Changes   []Change   // every change from base to snap, deletions included
	Conflicts []Conflict // paths where the host differs from base
	Applied   bool       // the changes were written to the host directory
}

// Promote applies the changes from snapshot base to snapshot snap to the
// host directory dir, which is expected to still hold base. Every changed
// path is checked first: if the host's entry differs from base (content,
// type, or presence), nothing is written and the error wraps ErrConflict;
// the result lists the conflicts. With dryRun, the check runs and nothing
// is written.
//
// Paths are resolved beneath dir without following any symlink, so a
// symlink on the host or in the snapshot cannot make a write land outside
// dir. Each file is replaced atomically (a temporary file renamed over it);
// the promotion as a whole is not atomic, and a change made on the host
// between the check and the write is not detected. Owners are not changed:
// new entries belong to the promoting user.
func (f *FS) Promote(ctx context.Context, base, snap SnapshotID, dir string, dryRun bool) (*PromoteResult, error) {
	changes, err := f.Diff(ctx, base, snap)
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("promote into %s: %w", dir, err)
	}
	defer unix.Close(root)
	h := &hostDir{fd: root, name: dir}
	res := &PromoteResult{Changes: changes}

	deleted := map[string]bool{}
	for _, c := range changes {
		if c.Kind == Deleted {
			deleted[c.Path] = true
		}
	}
	fresh := map[string]bool{} // directories the promotion creates
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if c.New != nil && c.New.Type == TypeDir && (c.Old == nil || c.Old.Type != TypeDir) {
			fresh[c.Path] = true
		}
		if c.Old == nil && fresh[path.Dir(c.Path)] {
			continue // inside a directory that does not exist yet
		}
		if reason, err := f.checkHost(h, c, deleted); err != nil {
			return nil, err
		} else if reason != "" {
			res.Conflicts = append(res.Conflicts, Conflict{Path: c.Path, Reason: reason})
		}
	}
	if len(res.Conflicts) > 0 {
		return res, fmt.Errorf("promote into %s: %d path(s) in conflict, first %q (%s): %w",
			dir, len(res.Conflicts), res.Conflicts[0].Path, res.Conflicts[0].Reason, ErrConflict)
	}
	if dryRun {
		return res, nil
	}
	// Removals first, deepest first (Diff lists a directory before its
	// contents), then creations and updates in Diff's order.
	for i := len(changes) - 1; i >= 0; i-- {
		c := changes[i]
		replaced := c.Kind == Modified && c.Old.Type != TypeFile // symlinks, devices
		if c.Path != "" && (c.Kind == Deleted || c.Kind == TypeChanged || replaced) {
			if err := h.remove(c.Path, c.Old.Type == TypeDir); err != nil {
				return res, err
			}
		}
	}
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		switch c.Kind {
		case Added, TypeChanged, Modified:
			if c.Path == "" {
				if err := h.setMeta("", c.New); err != nil {
					return res, err
				}
				continue
			}
			if err := f.create(h, c.Path, c.New); err != nil {
				return res, err
			}
		case ModeChanged:
			if err := h.setMeta(c.Path, c.New); err != nil {
				return res, err
			}
		}
	}
	res.Applied = true
	return res, nil
}

// checkHost returns why the host's entry at c.Path does not match the
// change's old side, or "" when it matches.
func (f *FS) checkHost(h *hostDir, c Change, deleted map[string]bool) (string, error) {
	if c.Path == "" {
		return "", nil // the top directory itself: only its metadata changes
	}
	var st unix.Stat_t
	err := h.lstat(c.Path, &st)
	if c.Old == nil {
		switch {
		case errors.Is(err, unix.ENOENT):
			return "", nil
		case err != nil:
			return "", err
		}
		return "exists on the host but not in the base snapshot", nil
	}
	if errors.Is(err, unix.ENOENT) {
		return "missing on the host", nil
	}
	if err != nil {
		return "", err
	}
	if typ, _ := typeOfMode(st.Mode); typ != c.Old.Type {
		return fmt.Sprintf("is a %s on the host, a %s in the base snapshot", typ, c.Old.Type), nil
	}
	switch c.Old.Type {
	case TypeFile:
		if st.Size != c.Old.Size {
			return fmt.Sprintf("size %d on the host, %d in the base snapshot", st.Size, c.Old.Size), nil
		}
		same, err := f.sameAsHost(h, c.Path, c.Old)
		if err != nil {
			return "", err
		}
		if !same {
			return "content differs from the base snapshot", nil
		}
	case TypeSymlink:
		target, err := h.readlink(c.Path)
		if err != nil {
			return "", err
		}
		if target != c.Old.Target {
			return fmt.Sprintf("symlink to %q on the host, to %q in the base snapshot", target, c.Old.Target), nil
		}
	case TypeDir:
		if c.Kind == Deleted || c.Kind == TypeChanged {
			names, err := h.list(c.Path)
			if err != nil {
				return "", err
			}
			for _, n := range names {
				if !deleted[path.Join(c.Path, n)] {
					return fmt.Sprintf("holds %q, which the base snapshot does not", n), nil
				}
			}
		}
	}
	if c.Kind == ModeChanged && st.Mode&0o7777 != c.Old.Mode&0o7777 {
		return fmt.Sprintf("mode %o on the host, %o in the base snapshot", st.Mode&0o7777, c.Old.Mode&0o7777), nil
	}
	return "", nil
}

// sameAsHost compares a host file with a file entry's content.
func (f *FS) sameAsHost(h *hostDir, p string, e *Entry) (bool, error) {
	fd, err := h.open(p, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	hf := os.NewFile(uintptr(fd), path.Join(h.name, p))
	defer hf.Close()
	want, err := f.entryReader(e)
	if err != nil {
		return false, err
	}
	a := make([]byte, 64<<10)
	b := make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(hf, a)
		nb, eb := io.ReadFull(want, b)
		if na != nb || !bytes.Equal(a[:na], b[:nb]) {
			return false, nil
		}
		if ea == io.EOF || ea == io.ErrUnexpectedEOF {
			return eb == io.EOF || eb == io.ErrUnexpectedEOF, nil
		}
		if ea != nil {
			return false, fmt.Errorf("read %s: %w", hf.Name(), ea)
		}
		if eb != nil {
			return false, fmt.Errorf("read snapshot file %s: %w", p, eb)
		}
	}
}

// entryReader streams a file entry's content from the store.
func (f *FS) entryReader(e *Entry) (io.Reader, error) {
	if e.ID.IsZero() {
		return bytes.NewReader(nil), nil
	}
	refs, _, err := getFile(f.store, e.ID)
	if err != nil {
		return nil, err
	}
	return f.store.NewReader(refs), nil
}

// create writes entry e at p on the host. A file replaces an existing one
// atomically.
func (f *FS) create(h *hostDir, p string, e *Entry) error {
	switch e.Type {
	case TypeDir:
		if err := h.mkdir(p, e.Mode); err != nil {
			return err
		}
	case TypeSymlink:
		return h.symlink(p, e.Target)
	case TypeFile:
		r, err := f.entryReader(e)
		if err != nil {
			return err
		}
		if err := h.writeFile(p, e.Mode, r); err != nil {
			return err
		}
	case TypeFifo, TypeChar, TypeBlock:
		if err := h.mknod(p, e); err != nil {
			return err
		}
	default:
		return nil // sockets belong to running programs, not to a tree
	}
	return h.setMeta(p, e)
}

// hostDir performs file operations beneath a directory fd, never following
// a symlink in any component of a path.
type hostDir struct {
	fd   int
	name string
}

// parent opens the directory holding p and returns it with p's last name.
func (h *hostDir) parent(p string) (int, string, error) {
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			return -1, "", fmt.Errorf("promote: refusing path %q", p)
		}
	}
	dir, name := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	fd, err := unix.Openat2(h.fd, dir, &unix.OpenHow{
		Flags:   unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, "", fmt.Errorf("open %s beneath %s: %w", dir, h.name, err)
	}
	return fd, name, nil
}

func (h *hostDir) lstat(p string, st *unix.Stat_t) error {
	d, name, err := h.parent(p)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return unix.ENOENT
		}
		return err
	}
	defer unix.Close(d)
	if err := unix.Fstatat(d, name, st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return unix.ENOENT
		}
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
	fd, err := h.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
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

func (h *hostDir) mkdir(p string, mode uint32) error {
	d, name, err := h.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	if err := unix.Mkdirat(d, name, mode&0o7777); err != nil {
		return fmt.Errorf("mkdir %s: %w", path.Join(h.name, p), err)
	}
	return nil
}

func (h *hostDir) symlink(p, target string) error {
	d, name, err := h.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	if err := unix.Symlinkat(target, d, name); err != nil {
		return fmt.Errorf("symlink %s: %w", path.Join(h.name, p), err)
	}
	return nil
}

func (h *hostDir) mknod(p string, e *Entry) error {
	d, name, err := h.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	mode := e.Mode & 0o7777
	switch e.Type {
	case TypeFifo:
		mode |= unix.S_IFIFO
	case TypeChar:
		mode |= unix.S_IFCHR
	case TypeBlock:
		mode |= unix.S_IFBLK
	}
	if err := unix.Mknodat(d, name, mode, int(e.Rdev)); err != nil {
		return fmt.Errorf("mknod %s: %w", path.Join(h.name, p), err)
	}
	return nil
}

// writeFile writes r to a temporary file beside p and renames it over p.
func (h *hostDir) writeFile(p string, mode uint32, r io.Reader) error {
	d, name, err := h.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	tmp := fmt.Sprintf(".%s.tine-promote-%d", name, os.Getpid())
	if len(tmp) > 255 {
		tmp = fmt.Sprintf(".tine-promote-%d", os.Getpid())
	}
	fd, err := unix.Openat(d, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode&0o7777)
	if err != nil {
		return fmt.Errorf("create %s: %w", path.Join(h.name, path.Dir(p), tmp), err)
	}
	out := os.NewFile(uintptr(fd), path.Join(h.name, path.Dir(p), tmp))
	_, err = io.Copy(out, r)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(d, tmp, d, name)
	}
	if err != nil {
		unix.Unlinkat(d, tmp, 0)
		return fmt.Errorf("write %s: %w", path.Join(h.name, p), err)
	}
	return nil
}

// setMeta sets mode and modification time of the entry at p ("" is the top
// directory). Symlinks keep their mode; only their time is set.
func (h *hostDir) setMeta(p string, e *Entry) error {
	d, name := h.fd, "."
	if p != "" {
		var err error
		if d, name, err = h.parent(p); err != nil {
			return err
		}
		defer unix.Close(d)
	}
	full := path.Join(h.name, p)
	if e.Type != TypeSymlink {
		if err := unix.Fchmodat(d, name, e.Mode&0o7777, 0); err != nil {
			return fmt.Errorf("chmod %s: %w", full, err)
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MtimeNs), unix.NsecToTimespec(e.MtimeNs)}
	if err := unix.UtimesNanoAt(d, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set time of %s: %w", full, err)
	}
	return nil
}
