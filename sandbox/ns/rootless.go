package ns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
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

var (
	rootlessOnce sync.Once
	rootlessOn   bool
)

// Rootless reports whether this process runs in a user namespace other
// than the host's, as rootless mode does: sandboxes then share it.
func Rootless() bool {
	rootlessOnce.Do(func() {
		b, err := os.ReadFile("/proc/self/uid_map")
		if err != nil {
			return
		}
		f := strings.Fields(string(b))
		rootlessOn = !(len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295")
	})
	return rootlessOn
}

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

// rootlessSkip are the top-level directories a rootless root does not
// take from the host: the init step mounts its own.
var rootlessSkip = map[string]bool{"proc": true, "sys": true, "dev": true, "tmp": true, "run": true}

// mountRootless builds a rootless sandbox's root at c.Root: a tmpfs with
// the host root's top-level symlinks, and over each top-level directory
// an overlay of the host's with the sandbox's layer (upper/NAME, its
// scratch directory work/NAME), in overlayfs's user.* attributes. A
// directory that cannot be overlaid (mounts below it) is bound read-only.
func mountRootless(c *initConfig) (int, error) {
	if err := unix.Mount("tmpfs", c.Root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755"); err != nil {
		return -1, fmt.Errorf("rootless root at %s: %w", c.Root, err)
	}
	ents, err := os.ReadDir("/")
	if err != nil {
		return -1, fmt.Errorf("rootless root: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		dst := filepath.Join(c.Root, name)
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink("/" + name)
			if err == nil {
				err = os.Symlink(t, dst)
			}
			if err != nil {
				return -1, fmt.Errorf("rootless root: /%s: %w", name, err)
			}
		case e.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return -1, fmt.Errorf("rootless root: %w", err)
			}
			if rootlessSkip[name] {
				continue
			}
			if err := overlayDir(c, name, dst); err != nil {
				if err := bindReadOnly("/"+name, dst); err != nil {
					return -1, err
				}
			}
		}
	}
	fd, err := unix.Open(c.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", c.Root, err)
	}
	return fd, nil
}

// overlayDir mounts at dst the overlay of the host's /name under the
// sandbox's layer for it.
func overlayDir(c *initConfig, name, dst string) error {
	if strings.ContainsAny(name, ",:\\\n") {
		return fmt.Errorf("%q: not an overlay option", name)
	}
	up, wk := filepath.Join(c.Upper, name), filepath.Join(c.Work, name)
	if err := os.MkdirAll(up, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(wk, 0o700); err != nil {
		return err
	}
	opts := "userxattr,lowerdir=/" + name + ",upperdir=" + up + ",workdir=" + wk
	if err := unix.Mount("overlay", dst, "overlay", 0, opts); err != nil {
		os.Remove(up) // empty unless the layer had files there
		return fmt.Errorf("overlay /%s: %w", name, err)
	}
	return nil
}

// bindReadOnly binds src (and the mounts below it) read-only at dst.
func bindReadOnly(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("rootless root: bind %s: %w", src, err)
	}
	var st unix.Statfs_t
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	if unix.Statfs(dst, &st) == nil {
		// Flags the host set are locked in a user namespace: keep them.
		flags |= uintptr(st.Flags) & (unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME)
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("rootless root: make %s read-only: %w", src, err)
	}
	return nil
}
