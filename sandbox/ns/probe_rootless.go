package ns

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"tine/internal/nsinit"
)

// modeRootlessProbe is initEnv's value for the process probeRootless
// starts.
const modeRootlessProbe = "rootless-probe"

// rootlessResult is the ns/rootless probe result (docs/adr/0096): what a
// user other than root needs, a live attempt where the tree is the
// host's, what that mode goes without, and which mode this process uses.
func (h hostPaths) rootlessResult(overlay, fuse, seccomp Check) ProbeResult {
	checks := []Check{h.checkUserns(), h.checkMaxUserns(), overlay, h.checkUserFUSE(fuse), seccomp}
	if h.root == "" {
		checks = append(checks, probeRootless())
	}
	r := result("ns", "rootless", checks...)
	// Not prerequisites: what rootless sandboxes go without.
	r.Checks = append(r.Checks,
		Check{Name: "pids limit", OK: true, Detail: "none: cgroups are not delegated to users here, so a create asking for a pids limit is refused"},
		Check{Name: "freezer", OK: true, Detail: "none: a snapshot stops the sandbox's processes with SIGSTOP (they see it as a job control stop)"},
		Check{Name: "host files", OK: true, Detail: "files the user cannot write (root's /usr, /etc) stay read-only in a sandbox; a top-level directory with mounts below it is bound read-only"},
		Check{Name: "network", OK: true, Detail: "none only: allow and open policies need root"},
	)
	return r
}

// inUse is the check naming the mode this process runs sandboxes in.
func inUse(h hostPaths) (root bool, c Check) {
	euid := os.Geteuid()
	if h.euid != nil {
		euid = *h.euid
	}
	switch {
	case h.root == "" && Rootless():
		return false, Check{Name: "in use", OK: true, Detail: "rootless: this daemon runs in a user namespace of its own"}
	case euid == 0:
		return true, Check{Name: "in use", OK: true, Detail: "root: tine runs as root"}
	default:
		return false, Check{Name: "in use", OK: true, Detail: fmt.Sprintf("rootless: tine runs as uid %d, not root", euid)}
	}
}

// checkUserFUSE: a user other than root can open /dev/fuse.
func (h hostPaths) checkUserFUSE(fuse Check) Check {
	c := Check{Name: "FUSE for users"}
	if !fuse.OK && !strings.Contains(fuse.Detail, "cannot open") {
		c.Detail = fuse.Detail
		return c
	}
	var st unix.Stat_t
	if err := unix.Stat(h.p("/dev/fuse"), &st); err != nil {
		c.Detail = fmt.Sprintf("/dev/fuse: %v", err)
		return c
	}
	euid := os.Geteuid()
	if h.euid != nil {
		euid = *h.euid
	}
	if euid != 0 || Rootless() {
		if fuse.OK {
			c.OK, c.Detail = true, "/dev/fuse opens read-write"
			return c
		}
		c.Detail = fmt.Sprintf("/dev/fuse is mode %o and this user cannot open it: chmod 0666 /dev/fuse (Debian's default), or grant the user access (setfacl -m u:USER:rw /dev/fuse)", st.Mode&0o777)
		return c
	}
	if st.Mode&0o006 == 0o006 {
		c.OK, c.Detail = true, "/dev/fuse is open to every user"
		return c
	}
	c.OK, c.Detail = true, fmt.Sprintf("/dev/fuse is mode %o: only users given access (setfacl -m u:USER:rw /dev/fuse, or chmod 0666) can run rootless", st.Mode&0o777)
	return c
}

// probeRootless starts this program as root in new user, mount, pid and
// network namespaces mapping one unprivileged id (the caller's, or
// nobody's when the caller is the host's root), where it mounts proc and
// an overlay with overlayfs's user.* attributes, as a rootless daemon and
// its sandboxes do.
func probeRootless() Check {
	c := Check{Name: "unprivileged mounts"}
	uid, gid := os.Geteuid(), os.Getegid()
	if uid == 0 && !Rootless() {
		uid, gid = 65534, 65534
	}
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{"tine-rootless-probe"}, Env: []string{initEnv + "=" + modeRootlessProbe}}
	cmd.SysProcAttr = rootlessAttr(uid, gid)
	cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWPID | syscall.CLONE_NEWNET
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		c.Detail = fmt.Sprintf("start a process in a new user namespace as uid %d: %v", uid, err)
		return c
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	cmd.Wait()
	if line = strings.TrimSpace(line); line != "ok" {
		c.Detail = fmt.Sprintf("as uid %d in a user namespace: %s", uid, line)
		return c
	}
	c.OK, c.Detail = true, "proc and an overlay (user.* attributes) mount in an unprivileged user namespace"
	return c
}

// runRootlessProbe is the process probeRootless starts.
func runRootlessProbe() {
	step := func(what string, err error) {
		if err != nil {
			fmt.Printf("%s: %v\n", what, err)
			os.Exit(0)
		}
	}
	step("make mounts private", unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""))
	step("mount proc", unix.Mount("proc", "/proc", "proc", nsinit.NoExec, ""))
	step("mount a tmpfs", unix.Mount("tmpfs", "/tmp", "tmpfs", 0, "size=64k"))
	for _, d := range []string{"/tmp/u", "/tmp/w", "/tmp/m"} {
		step("mkdir", os.Mkdir(d, 0o700))
	}
	step("mount an overlay of /usr", unix.Mount("overlay", "/tmp/m", "overlay", 0, "userxattr,lowerdir=/usr,upperdir=/tmp/u,workdir=/tmp/w"))
	fmt.Println("ok")
}
