package ns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The sandbox's own API (Spec.APISocket): a host socket bound read-only
// over an empty file at /run/tine/api.sock. A mount point cannot be
// removed or renamed (EBUSY), and the seccomp filter denies mount,
// umount2 and move_mount, so code in the sandbox can neither unbind the
// socket nor put one of its own in its place.

// apiSocket is the socket's name in agentDir.
const apiSocket = "api.sock"

// apiTarget is the mount point relative to the sandbox's root.
var apiTarget = strings.TrimPrefix(agentDir, "/") + "/" + apiSocket

// openAPISocket makes the mount point in the host's run directory
// runDir (bound at agentDir) and returns a detached, read-only mount of
// the socket at path.
func openAPISocket(path, runDir string) (int, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return -1, fmt.Errorf("api socket: %w", err)
	}
	if st.Mode().Type() != os.ModeSocket {
		return -1, fmt.Errorf("api socket %s is not a socket", path)
	}
	// The sandbox's root may be an unprivileged host uid (a user
	// namespace): it must be able to look the socket up in runDir.
	if err := os.Chmod(runDir, 0o711); err != nil {
		return -1, fmt.Errorf("api socket: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(runDir, apiSocket), os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return -1, fmt.Errorf("api socket mount point: %w", err)
	}
	f.Close()
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("clone the api socket %s: %w", path, err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("make the api socket's mount read-only: %w", err)
	}
	return fd, nil
}

// takeAPIFD takes the api socket's mount, the last of fds, when the
// config says one came.
func (c *initConfig) takeAPIFD(fds []int) ([]int, error) {
	c.apiFD = -1
	if !c.API {
		return fds, nil
	}
	if len(fds) == 0 {
		return fds, errors.New("the api socket's mount did not come with the config")
	}
	c.apiFD = fds[len(fds)-1]
	return fds[:len(fds)-1], nil
}

// attachAPI mounts the api socket's detached mount fd at its place in
// the root.
func (r root) attachAPI(fd int) error {
	if err := r.attach(fd, apiTarget, true); err != nil {
		return fmt.Errorf("api socket: %w", err)
	}
	return nil
}
