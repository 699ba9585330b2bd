package ns

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"tine/internal/nsinit"
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
	r := nsinit.Root{FD: rfd}
	if err := r.Attach(project, c.ProjectPath, false); err != nil {
		return fmt.Errorf("project: %w", err)
	}
	for _, h := range c.Hide {
		if err := r.Hide(strings.TrimPrefix(h, "/")); err != nil {
			return err
		}
	}
	if api >= 0 {
		if err := r.AttachAPI(api); err != nil {
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
	old := nsinit.Root{FD: rfd}
	if err := old.Attach(overlay, forkRootDir, false); err != nil {
		return fmt.Errorf("fork root: %w", err)
	}
	// The descriptor attach resolved names the directory under the
	// mount: open the mount itself.
	nfd, err := old.Open(forkRootDir, false, false)
	if err != nil {
		return fmt.Errorf("fork root: %w", err)
	}
	nr := nsinit.Root{FD: nfd}
	for _, p := range []string{"proc", "sys", "dev", "tmp", "run"} {
		if err := nr.Move("/"+p, p); err != nil {
			unix.Close(nfd)
			return fmt.Errorf("fork root: %w", err)
		}
	}
	return nsinit.PivotTo(nfd, "/"+forkRootDir)
}

// hostOverlay makes a fork's root without a user namespace: an overlay of
// the host root (the root mount only, as the init step's) under the
// stacked layer lower (over its empty base directory, see
// nsinit.StackedLower) and the layer upper (work: its work directory), as
// a detached mount.
func hostOverlay(lower, empty, upper, work string) (int, error) {
	lowers, sfd, err := nsinit.StackedLower(lower, empty, "/", nil)
	if err != nil {
		return -1, err
	}
	if sfd >= 0 {
		defer unix.Close(sfd)
	}
	return nsinit.NewMount("overlay", [][2]string{{"lowerdir", lowers}, {"upperdir", upper}, {"workdir", work}}, 0, nil)
}
