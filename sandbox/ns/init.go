package ns

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// initEnv marks a process started by Start as the sandbox's init step
// (modeInit).
const initEnv = "TINE_SANDBOX_INIT"

// modeInit is initEnv's value for the init step.
const modeInit = "1"

// Paths inside the sandbox.
const (
	agentDir    = "/run/tine"
	agentSocket = "agent.sock"
	agentBin    = "/run/tine-agent"
)

// initConfig is what Start hands the init step over its fd 3 (one
// message on a SOCK_SEQPACKET socket); fd 4 is the agent's listening
// socket.
type initConfig struct {
	// Warm: the project, the hidden paths and the host name are left to
	// the host's bind (see warm.go and bind.go).
	Warm  bool   `json:",omitempty"`
	Root  string // host path the overlay is mounted at
	Lower string `json:",omitempty"` // the overlay's lower layer: "/" when empty
	// Image is an image's unpacked root file system that is the
	// overlay's lower layer in place of the host root (see package oci).
	Image         string   `json:",omitempty"`
	Upper, Work   string   // the sandbox's overlay layer
	ProjectPath   string   // path of the project inside the sandbox
	ProjectSource string   // host directory serving it (a cowfs mount)
	RunDir        string   // host directory bound at agentDir
	Hide          []string // host paths covered by an empty read-only tmpfs
	Hostname      string
	Agent         string // host path of the agent binary
	// TmpfsBytes bounds /tmp, /run and /dev/shm (0: the default).
	TmpfsBytes int64 `json:",omitempty"`
	// Devices are host device nodes bound at the same path; ReadOnly are
	// host files bound read-only over themselves (see devices.go).
	Devices  []string `json:",omitempty"`
	ReadOnly []string `json:",omitempty"`

	// Userns: the sandbox runs in a user namespace, and the overlay, its
	// mount point, RunDir, Agent and the project come as descriptors
	// with the message (see userns.go's initFDs and takeFDs).
	Userns bool `json:",omitempty"`
	// set by takeFDs
	overlayFD, mountFD, projectFD, runFD, agentFD int
	// API: the sandbox's api socket comes as a detached mount, the last
	// descriptor with the message (apisock.go).
	API   bool `json:",omitempty"`
	apiFD int
}

// Init runs the sandbox's init step when the process was started as one by
// Start, and never returns then; otherwise it returns at once. Programs
// that start sandboxes call it first thing in main (tests: in TestMain),
// because Start re-executes the program itself (/proc/self/exe) to set the
// sandbox up before it executes the agent.
func Init() {
	switch os.Getenv(initEnv) {
	case modeInit:
		runtime.LockOSThread() // namespaces and exec belong to this thread
		err := closeInherited()
		if err == nil {
			err = runInit()
		}
		fmt.Fprintf(os.Stderr, "sandbox init: %v\n", err)
		os.Exit(125)
	case modeHold:
		runHold()
		os.Exit(0)
	case modeRootlessProbe:
		runRootlessProbe()
		os.Exit(0)
	case modeSpawn:
		runSpawner()
		os.Exit(0)
	}
}

// closeInherited marks every descriptor above the agent's socket (fd 4)
// close-on-exec: the host program may hold some without that flag (a
// FUSE device, pipes), and none may reach the sandbox's processes.
func closeInherited() error {
	if err := unix.CloseRange(5, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	return nil
}

// readMessage reads one message of at most maxMessage bytes from the
// control socket, with the descriptors passed along it.
func readMessage(fd int) ([]byte, []int, error) {
	buf := make([]byte, maxMessage)
	oob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, flags, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, err
		}
		for _, m := range msgs {
			f, err := unix.ParseUnixRights(&m)
			if err == nil {
				fds = append(fds, f...)
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		for _, f := range fds {
			unix.Close(f)
		}
		return nil, nil, errors.New("message too long")
	}
	if n == 0 {
		return nil, fds, io.EOF
	}
	return buf[:n], fds, nil
}

// runInit builds the sandbox's root, locks the process down and executes
// the agent. It returns only on failure.
func runInit() error {
	b, fds, err := readMessage(3)
	var c initConfig
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err == nil {
		fds, err = c.takeAPIFD(fds)
	}
	if err == nil && c.Userns {
		err = c.takeFDs(fds)
	} else if err == nil && len(fds) > 0 {
		closeAll(fds)
		err = fmt.Errorf("%d descriptors with the config, want none", len(fds))
	}
	if err != nil {
		return fmt.Errorf("read config from fd 3: %w", err)
	}
	if err := buildRoot(&c); err != nil {
		return err
	}
	if c.Hostname != "" {
		if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	// The cgroup namespace starts at the sandbox's group, which Start put
	// this process in before sending the config.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("new cgroup namespace: %w", err)
	}
	unix.Close(3)
	if err := dropCapabilities(); err != nil {
		return err
	}
	if err := installFilter(); err != nil {
		return err
	}
	argv := []string{"tine-agent", "--fd", "4", "--root", "/"}
	env := []string{"PATH=" + DefaultPath}
	err = unix.Exec(agentBin, argv, env)
	return fmt.Errorf("execute the agent: %w", err)
}

// DefaultPath is the PATH the agent runs with.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// root is the sandbox root being built, as a directory descriptor.
type root struct{ fd int }

// open resolves rel (slash-separated, relative to the root) without
// following any symlink, so nothing the sandbox wrote into its layer can
// send a mount elsewhere. Missing directories are made when mkdir is set;
// with file set the last component is made as an empty file.
func (r root) open(rel string, mkdir, file bool) (int, error) {
	parts := strings.FieldsFunc(rel, func(c rune) bool { return c == '/' })
	fd, err := unix.Dup(r.fd)
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
				err = errSymlink
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

// errSymlink is root.open's error for a symlink on the way.
var errSymlink = errors.New("a symbolic link, which is not followed")

// mount mounts src on rel inside the root (see open for how rel resolves).
func (r root) mount(src, rel, fstype string, flags uintptr, data string, file bool) error {
	fd, err := r.open(rel, true, file)
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
func (r root) readOnly(rel string, exec bool) error {
	fd, err := r.open(rel, false, false)
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
	bound, err := r.open(rel, false, false)
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

const (
	nosuidNodev = unix.MS_NOSUID | unix.MS_NODEV
	noexec      = nosuidNodev | unix.MS_NOEXEC
)

// buildRoot mounts the overlay of the host root, the sandbox's own /proc,
// /sys, /dev, /tmp and /run, the project and the agent's directory, covers
// the hidden paths and makes the result the root.
func buildRoot(c *initConfig) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	fd, err := mountOverlay(c)
	if err != nil {
		return err
	}
	r := root{fd}
	steps := []func() error{
		func() error { return r.mount("proc", "proc", "proc", noexec, "", false) },
		func() error { return r.mount("sysfs", "sys", "sysfs", noexec|unix.MS_RDONLY, "", false) },
		func() error {
			return r.mount("tmpfs", "dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755", false)
		},
		func() error {
			return r.mount("tmpfs", "tmp", "tmpfs", nosuidNodev, tmpfsOptions("1777", c.TmpfsBytes), false)
		},
		func() error {
			return r.mount("tmpfs", "run", "tmpfs", nosuidNodev, tmpfsOptions("755", c.TmpfsBytes), false)
		},
	}
	for _, p := range []string{"sys", "sysrq-trigger", "irq", "bus", "fs"} {
		steps = append(steps, func() error { return r.readOnly("proc/"+p, false) })
	}
	for _, p := range []string{"kcore", "keys", "timer_list"} {
		steps = append(steps, func() error {
			if _, err := os.Stat("/proc/" + p); err != nil {
				return nil
			}
			return r.mount("/dev/null", "proc/"+p, "", unix.MS_BIND, "", true)
		})
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		steps = append(steps, func() error { return r.mount("/dev/"+d, "dev/"+d, "", unix.MS_BIND, "", true) })
	}
	steps = append(steps,
		func() error {
			return r.mount("devpts", "dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620", false)
		},
		func() error {
			return r.mount("tmpfs", "dev/shm", "tmpfs", noexec, tmpfsOptions("1777", c.TmpfsBytes), false)
		},
		func() error { return r.devLinks() },
		func() error { return passDevices(r, c) },
		func() error {
			if c.Userns && c.runFD >= 0 {
				return r.attach(c.runFD, strings.TrimPrefix(agentDir, "/"), false)
			}
			return r.mount(c.RunDir, strings.TrimPrefix(agentDir, "/"), "", unix.MS_BIND, "", false)
		},
		func() error {
			if !c.API {
				return nil
			}
			defer unix.Close(c.apiFD)
			return r.attachAPI(c.apiFD)
		},
		// The agent binary, read-only, so that ps names it and no one in
		// the sandbox can write the host's copy.
		func() error {
			if c.Userns && c.agentFD >= 0 {
				return r.attach(c.agentFD, strings.TrimPrefix(agentBin, "/"), true)
			}
			return r.mount(c.Agent, strings.TrimPrefix(agentBin, "/"), "", unix.MS_BIND, "", true)
		},
		func() error { return r.readOnly(strings.TrimPrefix(agentBin, "/"), true) },
	)
	if !c.Warm {
		steps = append(steps, func() error {
			if c.Userns {
				return r.attach(c.projectFD, c.ProjectPath, false)
			}
			return r.mount(c.ProjectSource, c.ProjectPath, "", unix.MS_BIND, "", false)
		})
		for _, h := range c.Hide {
			steps = append(steps, func() error { return r.hide(h) })
		}
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return pivotTo(fd, c.Root)
}

// pivotTo makes the directory fd (named name in errors, and closed) the
// root of the mount namespace: pivot_root moves every process whose root
// or working directory was the old root, and the old root, left under the
// new one, is detached at once.
func pivotTo(fd int, name string) error {
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
func (r root) hide(rel string) error {
	fd, err := r.open(rel, false, false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hide %s: %w", rel, err)
	}
	defer unix.Close(fd)
	// Through the mount API's descriptors, not a /proc/self/fd path: the
	// host's binding thread runs this from outside the sandbox's pid
	// namespace, where that path does not resolve (binder.go).
	m, err := newMount("tmpfs", [][2]string{{"mode", "000"}, {"size", "4k"}},
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
func (r root) devLinks() error {
	dev, err := r.open("dev", false, false)
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

// mountOverlay mounts the sandbox's overlay root and returns a descriptor
// of it: in a user namespace it attaches the one the host made (see
// userns.go) on its mount point.
func mountOverlay(c *initConfig) (int, error) {
	if !c.Userns && Rootless() && c.Image == "" {
		return mountRootless(c) // rootless.go
	}
	if c.Userns {
		if c.mountFD < 0 {
			// The state directory is out of this process's reach: a
			// mount point on a small tmpfs over /tmp, which goes with the
			// host root at the pivot.
			if err := unix.Mount("tmpfs", "/tmp", "tmpfs", noexec, "mode=700,size=4k"); err != nil {
				return -1, fmt.Errorf("mount point for the root: %w", err)
			}
			if err := unix.Mkdir("/tmp/root", 0o700); err != nil {
				return -1, fmt.Errorf("mount point for the root: %w", err)
			}
			fd, err := unix.Open("/tmp/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return -1, fmt.Errorf("mount point for the root: %w", err)
			}
			c.mountFD = fd
		}
		err := unix.MoveMount(c.overlayFD, "", c.mountFD, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(c.mountFD)
		if err != nil {
			return -1, fmt.Errorf("attach the root overlay: %w", err)
		}
		return c.overlayFD, nil
	}
	lower := c.Lower
	if lower == "" {
		lower = "/"
	}
	if c.Image != "" {
		lower = c.Image
	}
	opts := "lowerdir=" + lower + ",upperdir=" + c.Upper + ",workdir=" + c.Work
	if Rootless() {
		opts = "userxattr," + opts // rootless.go: the layer's attributes are user.*
	}
	if err := unix.Mount("overlay", c.Root, "overlay", 0, opts); err != nil {
		return -1, fmt.Errorf("mount the root overlay at %s (%s): %w", c.Root, opts, err)
	}
	fd, err := unix.Open(c.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", c.Root, err)
	}
	return fd, nil
}

// attach mounts the detached mount fd at rel (made if missing, as an
// empty file when file is set).
func (r root) attach(fd int, rel string, file bool) error {
	target, err := r.open(rel, true, file)
	if err != nil {
		return fmt.Errorf("mount point %s: %w", rel, err)
	}
	defer unix.Close(target)
	if err := unix.MoveMount(fd, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount at %s: %w", rel, err)
	}
	return nil
}

// move moves the mount at from (a path in the current root), with those
// under it, to rel.
func (r root) move(from, rel string) error {
	target, err := r.open(rel, true, false)
	if err != nil {
		return fmt.Errorf("mount point %s: %w", rel, err)
	}
	defer unix.Close(target)
	if err := unix.MoveMount(unix.AT_FDCWD, from, target, "", unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("move %s to %s: %w", from, rel, err)
	}
	return nil
}

// loopbackUp brings up lo, the only interface of the new network namespace.
func loopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_LOOPBACK | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}

// kept are the capabilities the agent and the sandbox's root keep: enough
// to own files, switch users and signal its own processes; no mounts,
// tracing, raw sockets, devices, modules, clock or administration.
var kept = map[uintptr]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FOWNER: true, unix.CAP_FSETID: true,
	unix.CAP_KILL: true, unix.CAP_SETGID: true, unix.CAP_SETUID: true, unix.CAP_SETPCAP: true,
	unix.CAP_NET_BIND_SERVICE: true,
}

// dropCapabilities removes every other capability from the bounding set,
// which bounds what root gets at the next exec, and clears the ambient set.
func dropCapabilities() error {
	for c := uintptr(0); c <= 63; c++ {
		if kept[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	return nil
}

// passDevices binds the devices and read-only files of c (devices.go).
func passDevices(r root, c *initConfig) error {
	for _, d := range c.Devices {
		if err := r.mount(d, strings.TrimPrefix(d, "/"), "", unix.MS_BIND, "", true); err != nil {
			return err
		}
	}
	for _, f := range c.ReadOnly {
		if err := r.readOnly(strings.TrimPrefix(f, "/"), true); err != nil {
			return err
		}
	}
	return nil
}
