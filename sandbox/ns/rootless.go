package ns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"tine/internal/nsinit"
)

// Rootless mode (docs/adr/0096). A daemon started by a user other than
// root re-executes itself (EnterRootless) in a new user namespace that
// maps only that user, as root, and a new mount namespace. There it is
// root over its own namespaces: it mounts FUSE (cowfs) and overlayfs, and
// starts sandboxes in new mount, pid, network, uts, ipc and cgroup
// namespaces below it. What it cannot do is act on anything the user
// could not: host files owned by other users (root's /usr, /etc) appear
// owned by nobody and stay read-only in a sandbox, cgroups it was not
// given cannot be made (no pids limit; snapshots stop the sandbox's
// processes with SIGSTOP instead of the freezer), and the overlay of the
// host root is one overlay per top-level directory (an unprivileged
// overlay cannot take "/" as its lower layer while mounts such as /proc
// lie below it).

// rootlessEnv marks the process EnterRootless started.
const rootlessEnv = "TINE_ROOTLESS"

// Rootless reports whether this process runs in a user namespace other
// than the host's, as rootless mode does: sandboxes then share it.
func Rootless() bool { return nsinit.Rootless() }

// EnterRootless re-executes this program, with the same arguments,
// environment and standard streams, as root in a new user namespace that
// maps the calling user (uid and gid) and nothing else, with its own
// mount namespace, and exits with its status. It returns at once, doing
// nothing, when the caller is root already (the host's root, or in
// rootless mode) and an error when the host does not allow it.
func EnterRootless() error {
	if os.Geteuid() == 0 {
		return nil
	}
	if os.Getenv(rootlessEnv) != "" {
		return errors.New("rootless: the re-executed daemon is not root in its user namespace")
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), rootlessEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = rootlessAttr(os.Geteuid(), os.Getegid())
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("rootless: start in a new user namespace (does the host allow unprivileged user namespaces? see tine info): %w", err)
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			os.Exit(128 + int(ws.Signal()))
		}
		os.Exit(ee.ExitCode())
	}
	if err != nil {
		return fmt.Errorf("rootless: %w", err)
	}
	os.Exit(0)
	return nil
}

// rootlessAttr starts a process as root in new user and mount namespaces
// mapping host uid and gid only.
func rootlessAttr(uid, gid int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
		Credential:  &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
	}
}
