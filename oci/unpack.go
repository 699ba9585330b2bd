package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Limits bound what unpacking one image may make. Zero fields take the
// defaults (DefaultLimits).
type Limits struct {
	// Bytes is the most bytes of file content, over all layers.
	Bytes int64 `json:"bytes,omitempty"`
	// Entries is the most tar entries, over all layers.
	Entries int `json:"entries,omitempty"`
	// Layers is the most layers an image may have.
	Layers int `json:"layers,omitempty"`
}

// DefaultLimits are the bounds used where a Limits field is zero.
var DefaultLimits = Limits{Bytes: 16 << 30, Entries: 1 << 20, Layers: 128}

func (l Limits) withDefaults() Limits {
	if l.Bytes <= 0 {
		l.Bytes = DefaultLimits.Bytes
	}
	if l.Entries <= 0 {
		l.Entries = DefaultLimits.Entries
	}
	if l.Layers <= 0 {
		l.Layers = DefaultLimits.Layers
	}
	return l
}

// Bounds on one entry's name.
const (
	maxNameLen   = 4096
	maxNameDepth = 256
)

// Layer is one layer to unpack: Name names it in errors (its digest),
// Open returns its uncompressed tar stream.
type Layer struct {
	Name string
	Open func() (io.ReadCloser, error)
}

// Stats says what Unpack made.
type Stats struct {
	Bytes   int64 `json:"bytes"`
	Entries int   `json:"entries"`
	Skipped int   `json:"skipped"` // device nodes and entries of unknown types
}

// Unpack applies the layers, in order, to the directory root (which
// should be empty). Every entry is taken as hostile: names are resolved
// inside root (a symlink in a parent resolves as if root were /, and the
// last component is never followed), whiteouts remove only what earlier
// layers made, device nodes are skipped, only user.* extended attributes
// are kept, hard links must name an entry inside root, and the limits
// bound bytes, entries and layers. Errors name the layer and the entry.
func Unpack(ctx context.Context, root string, layers []Layer, lim Limits) (Stats, error) {
	lim = lim.withDefaults()
	var st Stats
	if len(layers) > lim.Layers {
		return st, fmt.Errorf("unpack into %s: %d layers, more than the limit of %d", root, len(layers), lim.Layers)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return st, fmt.Errorf("unpack into %s: %w", root, err)
	}
	defer unix.Close(fd)
	u := &unpacker{ctx: ctx, root: fd, lim: lim, st: &st, root0: unix.Geteuid() == 0}
	for i, l := range layers {
		if err := u.layer(l); err != nil {
			return st, fmt.Errorf("unpack layer %d (%s): %w", i+1, l.Name, err)
		}
	}
	return st, nil
}

type unpacker struct {
	ctx   context.Context
	root  int // O_PATH descriptor of the rootfs
	lim   Limits
	st    *Stats
	root0 bool // running as root: owners are set
	// made holds the names (cleaned, relative) this layer made: a
	// whiteout in the same layer must not remove them.
	made map[string]bool
}

func (u *unpacker) layer(l Layer) error {
	rc, err := l.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	u.made = map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		u.st.Entries++
		if u.st.Entries > u.lim.Entries {
			return fmt.Errorf("entry %q: more than the limit of %d entries", h.Name, u.lim.Entries)
		}
		if err := u.entry(h, tr); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
}

// clean turns an entry name into a path relative to the rootfs, or
// refuses it: ".." components, NUL bytes, names too long or too deep.
// "" is the rootfs itself.
func clean(name string) (string, error) {
	if len(name) > maxNameLen {
		return "", fmt.Errorf("name longer than %d bytes", maxNameLen)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", errors.New("name holds a NUL byte")
	}
	parts := strings.Split(name, "/")
	if len(parts) > maxNameDepth {
		return "", fmt.Errorf("name deeper than %d components", maxNameDepth)
	}
	for _, p := range parts {
		if p == ".." {
			return "", errors.New("name has a .. component")
		}
	}
	c := strings.TrimPrefix(path.Clean("/"+name), "/")
	return c, nil
}

func (u *unpacker) entry(h *tar.Header, r io.Reader) error {
	rel, err := clean(h.Name)
	if err != nil {
		return err
	}
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	// Whiteouts.
	if base == ".wh..wh..opq" {
		return u.opaque(dir)
	}
	if strings.HasPrefix(base, ".wh.") {
		victim := strings.TrimPrefix(base, ".wh.")
		if victim == "" || victim == "." || victim == ".." {
			return errors.New("whiteout names no entry")
		}
		return u.whiteout(path.Join(dir, victim))
	}
	if rel == "" {
		if h.Typeflag != tar.TypeDir {
			return errors.New("names the root but is not a directory")
		}
		return nil // the rootfs's own attributes stay
	}
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		u.st.Skipped++
		return nil
	case tar.TypeReg, tar.TypeRegA, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		u.st.Skipped++
		return nil
	}
	if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeRegA {
		if h.Size < 0 || h.Size > u.lim.Bytes-u.st.Bytes {
			return fmt.Errorf("%d bytes: more than the limit of %d bytes for the image", h.Size, u.lim.Bytes)
		}
	}
	pfd, err := u.mkdirAll(dir)
	if err != nil {
		return fmt.Errorf("parent directory %q: %w", dir, err)
	}
	defer unix.Close(pfd)
	// What is there already is replaced, unless both are directories.
	var old unix.Stat_t
	if err := unix.Fstatat(pfd, base, &old, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if h.Typeflag == tar.TypeDir && old.Mode&unix.S_IFMT == unix.S_IFDIR {
			u.made[rel] = true
			return u.attrsAt(pfd, base, h)
		}
		if err := removeAt(pfd, base, 0); err != nil {
			return fmt.Errorf("replace the entry there: %w", err)
		}
	} else if !errors.Is(err, unix.ENOENT) {
		return err
	}
	u.made[rel] = true
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return err
		}
		return u.attrsAt(pfd, base, h)
	case tar.TypeSymlink:
		if len(h.Linkname) > maxNameLen || strings.IndexByte(h.Linkname, 0) >= 0 || h.Linkname == "" {
			return errors.New("bad symlink target")
		}
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return err
		}
		return u.attrsAt(pfd, base, h)
	case tar.TypeFifo:
		if err := unix.Mkfifoat(pfd, base, 0o600); err != nil {
			return err
		}
		return u.attrsAt(pfd, base, h)
	case tar.TypeLink:
		return u.link(pfd, base, h)
	}
	return u.file(pfd, base, h, r)
}

// mkdirAll returns an O_PATH descriptor of the directory rel inside the
// rootfs, made (0755, root's) where missing. Symlinks on the way resolve
// inside the rootfs.
func (u *unpacker) mkdirAll(rel string) (int, error) {
	if rel == "" {
		return unix.FcntlInt(uintptr(u.root), unix.F_DUPFD_CLOEXEC, 0)
	}
	fd, err := u.openDir(rel)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	dir, base := path.Split(rel)
	pfd, err := u.mkdirAll(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return openBeneath(pfd, base)
}

// openDir opens the directory rel, resolved inside the rootfs.
func (u *unpacker) openDir(rel string) (int, error) {
	if rel == "" {
		rel = "."
	}
	return unix.Openat2(u.root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// openBeneath opens the directory name in pfd, not following a symlink.
func openBeneath(pfd int, name string) (int, error) {
	return unix.Openat2(pfd, name, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// file writes a regular file's content and attributes.
func (u *unpacker) file(pfd int, base string, h *tar.Header, r io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	n, err := io.Copy(f, io.LimitReader(r, h.Size))
	u.st.Bytes += n
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if n != h.Size {
		return fmt.Errorf("content ends after %d of %d bytes", n, h.Size)
	}
	return u.attrsFD(fd, h)
}

// link makes base in pfd a hard link to the entry h.Linkname names,
// resolved inside the rootfs.
func (u *unpacker) link(pfd int, base string, h *tar.Header) error {
	target, err := clean(h.Linkname)
	if err != nil || target == "" {
		return fmt.Errorf("hard link target %q: refused: %v", h.Linkname, err)
	}
	tdir, tbase := path.Split(target)
	tfd, err := u.openDir(strings.TrimSuffix(tdir, "/"))
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", h.Linkname, err)
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("hard link target %q: %w", h.Linkname, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("hard link target %q is a directory", h.Linkname)
	}
	// No AT_SYMLINK_FOLLOW: a symlink is linked itself, never followed.
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return fmt.Errorf("hard link to %q: %w", h.Linkname, err)
	}
	return nil
}

// attrsAt sets the owner, user.* attributes, mode and times of the
// entry base in pfd (not followed if a symlink).
func (u *unpacker) attrsAt(pfd int, base string, h *tar.Header) error {
	if h.Typeflag == tar.TypeSymlink {
		if u.root0 {
			err := unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW)
			if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: see attrsFD
				return fmt.Errorf("chown: %w", err)
			}
		}
		return nil
	}
	fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	rfd, err := reopen(fd)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	return u.attrsFD(rfd, h)
}

// attrsFD sets the owner, user.* attributes, mode and times of the open
// file fd: owner first (a chown clears set-id bits), times last.
func (u *unpacker) attrsFD(fd int, h *tar.Header) error {
	owned := u.root0
	if u.root0 {
		if h.Uid < 0 || h.Gid < 0 {
			return fmt.Errorf("owner %d:%d", h.Uid, h.Gid)
		}
		err := unix.Fchown(fd, h.Uid, h.Gid)
		if errors.Is(err, unix.EINVAL) {
			// The owner is not mapped in this user namespace (a rootless
			// daemon maps one id): the entry stays the daemon's.
			owned, err = false, nil
		}
		if err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !strings.HasPrefix(name, "user.") {
			continue // security.*, trusted.* (overlayfs's), system.*: dropped
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	mode := uint32(h.Mode) & 0o7777
	if !owned {
		mode &^= unix.S_ISUID | unix.S_ISGID // would name an owner not set
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if !h.ModTime.IsZero() {
		ts := unix.NsecToTimespec(h.ModTime.UnixNano())
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), []unix.Timespec{ts, ts}, 0); err != nil {
			return fmt.Errorf("set times: %w", err)
		}
	}
	return nil
}

// reopen turns an O_PATH descriptor into a read-only one of the same
// file, which fchown, fchmod and fsetxattr take.
func reopen(fd int) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return -1, err
	}
	flags := unix.O_RDONLY | unix.O_CLOEXEC
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		flags |= unix.O_DIRECTORY
	} else if st.Mode&unix.S_IFMT == unix.S_IFIFO {
		flags |= unix.O_NONBLOCK
	} else if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, fmt.Errorf("unexpected file type %#o", st.Mode&unix.S_IFMT)
	}
	return unix.Openat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), flags, 0)
}

// whiteout removes the entry rel that an earlier layer made.
func (u *unpacker) whiteout(rel string) error {
	if u.made[rel] {
		return nil // this layer's own
	}
	dir, base := path.Split(rel)
	pfd, err := u.openDir(strings.TrimSuffix(dir, "/"))
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("whiteout: %w", err)
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("whiteout: %w", err)
	}
	return nil
}

// opaque removes what earlier layers made in the directory rel.
func (u *unpacker) opaque(rel string) error {
	pfd, err := u.mkdirAll(rel)
	if err != nil {
		return fmt.Errorf("opaque directory: %w", err)
	}
	defer unix.Close(pfd)
	names, err := readNames(pfd)
	if err != nil {
		return fmt.Errorf("opaque directory: %w", err)
	}
	for _, n := range names {
		if u.made[path.Join(rel, n)] {
			continue
		}
		if err := removeAt(pfd, n, 0); err != nil {
			return fmt.Errorf("opaque directory: %w", err)
		}
	}
	return nil
}

// readNames lists the directory pfd (an O_PATH descriptor).
func readNames(pfd int) ([]string, error) {
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// removeAt removes the entry name in pfd, a directory with all it holds;
// no symlink is followed.
func removeAt(pfd int, name string, depth int) error {
	err := unix.Unlinkat(pfd, name, 0)
	if err == nil || !(errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM)) {
		return err
	}
	if depth > maxNameDepth {
		return errors.New("directory too deep to remove")
	}
	dfd, err := openBeneath(pfd, name)
	if err != nil {
		return err
	}
	names, err := readNames(dfd)
	if err == nil {
		for _, n := range names {
			if err = removeAt(dfd, n, depth+1); err != nil {
				break
			}
		}
	}
	unix.Close(dfd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
}
