package ns

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"tine/internal/nsinit"
)

// The sandbox's own API (Spec.APISocket): a host socket bound read-only
// over an empty file at /run/tine/api.sock (nsinit.Root.AttachAPI).

// openAPISocket makes the mount point in the host's run directory
// runDir (bound at nsinit.AgentDir) and returns a detached, read-only mount of
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
	f, err := os.OpenFile(filepath.Join(runDir, nsinit.APISocket), os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o644)
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
