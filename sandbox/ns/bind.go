package ns

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// What binding a warm instance to its sandbox does inside it, run by the
// host's binding thread in the sandbox's mount and UTS namespaces
// (binder.go). Nothing here mounts a new proc or sysfs: one made from
// outside the sandbox's pid and network namespaces would show the host's.

// bindConfig says what a bind attaches.
type bindConfig struct {
	ProjectPath string
	Hide        []string
	Hostname    string
}

// attachProject mounts the project (a detached mount) at its path in the
// current root, covers the hidden paths, attaches the API socket when api
// is not -1 and sets the host name.
func attachProject(c *bindConfig, project, api int) error {
	rfd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	r := root{rfd}
	if err := r.attach(project, c.ProjectPath, false); err != nil {
		return fmt.Errorf("project: %w", err)
	}
	for _, h := range c.Hide {
		if err := r.hide(strings.TrimPrefix(h, "/")); err != nil {
			return err
		}
	}
	if api >= 0 {
		if err := r.attachAPI(api); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	return nil
}

// forkRootDir is where a fork's root is attached in the warm root before
// the pivot: a directory of the warm root's own layer, which goes with it.
const forkRootDir = ".tine-fork-root"

// forkRoot builds the root of a fork in place of the warm one: overlay
// (the fork's root, an overlay of the host root under a copy of the
// seed's layer, made by the host) is attached in the warm root, the warm
// root's /proc, /sys, /dev, /tmp and /run (the agent's directory and
// binary with it) move onto it, unused but for the agent, and it becomes
// the root. pivot_root moves the agent too; the warm root, whose layer no
// one wrote, is detached.
func forkRoot(overlay int) error {
	rfd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	old := root{rfd}
	if err := old.attach(overlay, forkRootDir, false); err != nil {
		return fmt.Errorf("fork root: %w", err)
	}
	// The descriptor attach resolved names the directory under the
	// mount: open the mount itself.
	nfd, err := old.open(forkRootDir, false, false)
	if err != nil {
		return fmt.Errorf("fork root: %w", err)
	}
	nr := root{nfd}
	for _, p := range []string{"proc", "sys", "dev", "tmp", "run"} {
		if err := nr.move("/"+p, p); err != nil {
			unix.Close(nfd)
			return fmt.Errorf("fork root: %w", err)
		}
	}
	return pivotTo(nfd, "/"+forkRootDir)
}

// hostOverlay makes a fork's root without a user namespace: an overlay of
// the host root (the root mount only, as the init step's) under the layer
// upper (work: its work directory), as a detached mount.
func hostOverlay(upper, work string) (int, error) {
	return newMount("overlay", [][2]string{{"lowerdir", "/"}, {"upperdir", upper}, {"workdir", work}}, 0, nil)
}

// newMount makes a file system of type fstype with the options opts (key,
// value) as a detached mount with the MOUNT_ATTR_ flags attrs, through
// the mount API's descriptors (no path names a mount point); create, if
// not nil, runs its creation step.
func newMount(fstype string, opts [][2]string, attrs int, create func(func() error) error) (int, error) {
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
