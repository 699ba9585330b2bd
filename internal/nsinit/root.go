package nsinit

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Root is the sandbox root being built, as a directory descriptor.
type Root struct{ FD int }

// Open resolves rel (slash-separated, relative to the root) without
// following any symlink, so nothing the sandbox wrote into its layer can
// send a mount elsewhere. Missing directories are made when mkdir is set;
// with file set the last component is made as an empty file.
func (r Root) Open(rel string, mkdir, file bool) (int, error) {
	parts := strings.FieldsFunc(rel, func(c rune) bool { return c == '/' })
	fd, err := unix.FcntlInt(uintptr(r.FD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for i, p := range parts {
		if p == "." || p == ".." {
			unix.Close(fd)
			return -1, fmt.Errorf("path %q: %q is not allowed", rel, p)
		}
		last := i == len(parts)-1
		how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH}
		next, err := unix.Openat2(fd, p, how)
		if errors.Is(err, unix.ENOENT) && mkdir {
			if last && file {
				var c int
				if c, err = unix.Openat(fd, p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644); err == nil {
					unix.Close(c)
				}
			} else {
				err = unix.Mkdirat(fd, p, 0o755)
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat2(fd, p, how)
			}
		}
		unix.Close(fd)
		if err == nil {
			// O_PATH|O_NOFOLLOW opens a symlink itself: refuse it here,
			// rather than as whatever a mount onto it or a lookup below it
			// says.
			var st unix.Stat_t
			if err = unix.Fstat(next, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = ErrSymlink
			}
			if err != nil {
				unix.Close(next)
			}
		}
		if err != nil {
			return -1, fmt.Errorf("path %q at %q: %w", rel, p, err)
		}
		fd = next
	}
	return fd, nil
}

// ErrSymlink is root.open's error for a symlink on the way.
var ErrSymlink = errors.New("a symbolic link, which is not followed")

// mount mounts src on rel inside the root (see Open for how rel resolves).
func (r Root) mount(src, rel, fstype string, flags uintptr, data string, file bool) error {
	fd, err := r.Open(rel, true, file)
	if err != nil {
		return fmt.Errorf("mount %s: %w", rel, err)
	}
	defer unix.Close(fd)
	if err := unix.Mount(src, fmt.Sprintf("/proc/self/fd/%d", fd), fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", src, fstype, rel, err)
	}
	return nil
}

// readOnly makes the mount at rel read-only (and noexec unless exec),
// binding rel onto itself first.
func (r Root) readOnly(rel string, exec bool) error {
	fd, err := r.Open(rel, false, false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	p := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", rel, err)
	}
	// fd still names the mount below the new bind: open the bind itself.
	bound, err := r.Open(rel, false, false)
	if err != nil {
		return err
	}
	defer unix.Close(bound)
	p = fmt.Sprintf("/proc/self/fd/%d", bound)
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | nosuidNodev)
	if !exec {
		flags |= unix.MS_NOEXEC
	}
	if err := unix.Mount("", p, "", flags, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", rel, err)
	}
	return nil
}

// Mount flags of the sandbox's own file systems.
const (
	nosuidNodev = unix.MS_NOSUID | unix.MS_NODEV
	// NoExec mounts with no setuid, no devices and no programs.
	NoExec = nosuidNodev | unix.MS_NOEXEC
)

// PivotTo makes the directory fd (named name in errors, and closed) the
// root of the mount namespace: pivot_root moves every process whose root
// or working directory was the old root, and the old root, left under the
// new one, is detached at once.
func PivotTo(fd int, name string) error {
	err := unix.Fchdir(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("enter the new root %s: %w", name, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root to %s: %w", name, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return unix.Chdir("/")
}

// hide covers the directory at rel, if there is one, with an empty
// read-only tmpfs.
func (r Root) Hide(rel string) error {
	fd, err := r.Open(rel, false, false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hide %s: %w", rel, err)
	}
	defer unix.Close(fd)
	// Through the mount API's descriptors, not a /proc/self/fd path: the
	// host's binding thread runs this from outside the sandbox's pid
	// namespace, where that path does not resolve (package ns: binder.go).
	m, err := NewMount("tmpfs", [][2]string{{"mode", "000"}, {"size", "4k"}},
		unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC, nil)
	if err != nil {
		return fmt.Errorf("hide %s: %w", rel, err)
	}
	defer unix.Close(m)
	if err := unix.MoveMount(m, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("hide %s: %w", rel, err)
	}
	return nil
}

// devLinks adds the usual symlinks of /dev (a fresh tmpfs, so no one
// else wrote in it).
func (r Root) devLinks() error {
	dev, err := r.Open("dev", false, false)
	if err != nil {
		return err
	}
	defer unix.Close(dev)
	for name, target := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd",
		"stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := unix.Symlinkat(target, dev, name); err != nil {
			return fmt.Errorf("make /dev/%s: %w", name, err)
		}
	}
	return nil
}

// Attach mounts the detached mount fd at rel (made if missing, as an
// empty file when file is set).
func (r Root) Attach(fd int, rel string, file bool) error {
	target, err := r.Open(rel, true, file)
	if err != nil {
		return fmt.Errorf("mount point %s: %w", rel, err)
	}
	defer unix.Close(target)
	if err := unix.MoveMount(fd, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount at %s: %w", rel, err)
	}
	return nil
}

// Move moves the mount at from (a path in the current root), with those
// under it, to rel.
func (r Root) Move(from, rel string) error {
	target, err := r.Open(rel, true, false)
	if err != nil {
		return fmt.Errorf("mount point %s: %w", rel, err)
	}
	defer unix.Close(target)
	if err := unix.MoveMount(unix.AT_FDCWD, from, target, "", unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("move %s to %s: %w", from, rel, err)
	}
	return nil
}

// AttachAPI mounts the api socket's detached mount fd at its place in
// the root: a mount point cannot be removed or renamed (EBUSY), and the
// seccomp filter denies the calls that unmount or move one, so code in
// the sandbox can neither unbind the socket nor put one of its own there.
func (r Root) AttachAPI(fd int) error {
	if err := r.Attach(fd, strings.TrimPrefix(AgentDir, "/")+"/"+APISocket, true); err != nil {
		return fmt.Errorf("api socket: %w", err)
	}
	return nil
}

// StackedLower returns the lowerdir of an overlay over base (a directory
// or a /proc/self/fd path) with the stacked layer layer above it (package
// ns: layerlink.go), unless layer is "": the layer is given as a
// read-only overlay of its own, over the empty directory empty, which
// unescapes its whiteouts and opaque marks (and lets a layer inside base
// be a lower layer at all). fd is that overlay's detached mount, -1 when
// none, for the caller to close once its overlay is made; create is
// NewMount's.
func StackedLower(layer, empty, base string, create func(func() error) error) (lowerdir string, fd int, err error) {
	if layer == "" {
		return base, -1, nil
	}
	fd, err = NewMount("overlay", [][2]string{{"lowerdir", layer + ":" + empty}}, unix.MOUNT_ATTR_RDONLY, create)
	if err != nil {
		return "", -1, fmt.Errorf("stacked layer %s: %w", layer, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d:%s", fd, base), fd, nil
}

// NewMount makes a file system of type fstype with the options opts (key,
// value) as a detached mount with the MOUNT_ATTR_ flags attrs, through
// the mount API's descriptors (no path names a mount point); create, if
// not nil, runs its creation step.
func NewMount(fstype string, opts [][2]string, attrs int, create func(func() error) error) (int, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("%s: %w", fstype, err)
	}
	defer unix.Close(fs)
	for _, o := range opts {
		if err := unix.FsconfigSetString(fs, o[0], o[1]); err != nil {
			return -1, fmt.Errorf("%s %s=%s: %w", fstype, o[0], o[1], err)
		}
	}
	if create == nil {
		create = func(f func() error) error { return f() }
	}
	if err := create(func() error { return unix.FsconfigCreate(fs) }); err != nil {
		return -1, fmt.Errorf("%s: %w", fstype, err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("%s: %w", fstype, err)
	}
	return fd, nil
}
