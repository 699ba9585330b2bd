package ns

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"tine/internal/nsinit"
)

// Check is one prerequisite a probe looked at.
type Check struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Detail says what was found, and when not OK what to do about it.
	Detail string `json:"detail"`
}

// ProbeResult says whether this host can run one runtime in one mode.
type ProbeResult struct {
	Runtime string `json:"runtime"` // "ns" or "vm"
	Mode    string `json:"mode"`    // "root" or "rootless" for ns; "kvm" for vm
	// OK is true when every check passed and tine implements the mode.
	OK bool `json:"ok"`
	// Why names the failed checks (or what tine lacks), empty when OK.
	Why    []string `json:"why,omitempty"`
	Checks []Check  `json:"checks"`
}

// Probe reports which runtimes and modes this host can run, and why not.
// It reads files and opens devices; where ns/root can run it also starts
// one short-lived process in a new user namespace to see whether
// sandboxes get one (the "user namespace" check of ns/root, which does
// not decide OK). It changes nothing.
func Probe() []ProbeResult { return probeAt(hostPaths{}) }

// hostPaths roots the files a probe reads, so that tests can give it
// another tree; "" is the host's.
type hostPaths struct {
	root string
	euid *int
	caps *uint64
}

func (h hostPaths) p(path string) string { return filepath.Join("/", h.root, path) }

func (h hostPaths) read(path string) (string, error) {
	b, err := os.ReadFile(h.p(path))
	return strings.TrimSpace(string(b)), err
}

// probeAt runs the probe over the tree h.
func probeAt(h hostPaths) []ProbeResult {
	admin := h.checkAdmin()
	overlay := h.checkFilesystem("overlay", "overlayfs", "modprobe overlay")
	fuse := h.checkFUSE()
	pids := h.checkPids()
	freezer := h.checkFreezer()
	seccomp := h.checkSeccomp()

	root := result("ns", "root", admin, overlay, fuse, pids, freezer, seccomp)
	if h.root == "" && root.OK {
		// Not a prerequisite: sandboxes run without one where the host
		// does not allow it (userns.go).
		root.Checks = append(root.Checks, probeUserns())
	}
	rootless := h.rootlessResult(overlay, fuse, seccomp) // probe_rootless.go
	if isRoot, use := inUse(h); isRoot {
		root.Checks = append(root.Checks, use)
	} else {
		rootless.Checks = append(rootless.Checks, use)
		if h.root == "" && Rootless() {
			root.OK, root.Why = false, append(root.Why, "this process runs in a user namespace (rootless mode)")
		}
	}
	vm := result("vm", "kvm", h.checkKVM())
	vm.OK = false
	vm.Why = append(vm.Why, "tine does not run sandboxes in VMs yet (tine vm runs bare guests and Linux boots on their own)")
	return []ProbeResult{root, rootless, vm}
}

func result(rt, mode string, checks ...Check) ProbeResult {
	r := ProbeResult{Runtime: rt, Mode: mode, OK: true, Checks: checks}
	for _, c := range checks {
		if !c.OK {
			r.OK = false
			r.Why = append(r.Why, c.Name+": "+c.Detail)
		}
	}
	return r
}

// capSysAdmin is CAP_SYS_ADMIN's bit in the capability sets.
const capSysAdmin = 21

func (h hostPaths) checkAdmin() Check {
	c := Check{Name: "root or CAP_SYS_ADMIN"}
	euid := os.Geteuid()
	if h.euid != nil {
		euid = *h.euid
	}
	var eff uint64
	if h.caps != nil {
		eff = *h.caps
	} else if st, err := h.read("proc/self/status"); err == nil {
		for _, l := range strings.Split(st, "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
				eff, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			}
		}
	}
	switch {
	case euid == 0 && eff&(1<<capSysAdmin) != 0:
		c.OK, c.Detail = true, "running as root with CAP_SYS_ADMIN"
	case eff&(1<<capSysAdmin) != 0:
		c.OK, c.Detail = true, fmt.Sprintf("uid %d with CAP_SYS_ADMIN", euid)
	default:
		c.Detail = fmt.Sprintf("uid %d without CAP_SYS_ADMIN: run as root (mounts, pid and network namespaces need it)", euid)
	}
	return c
}

// checkFilesystem looks for fstype in /proc/filesystems.
func (h hostPaths) checkFilesystem(fstype, what, fix string) Check {
	c := Check{Name: what}
	fs, err := h.read("proc/filesystems")
	if err != nil {
		c.Detail = fmt.Sprintf("cannot read /proc/filesystems: %v", err)
		return c
	}
	for _, l := range strings.Split(fs, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[len(f)-1] == fstype {
			c.OK, c.Detail = true, fstype+" is in /proc/filesystems"
			return c
		}
	}
	c.Detail = fmt.Sprintf("%s is not in /proc/filesystems: load it (%s) or use a kernel with it", fstype, fix)
	return c
}

func (h hostPaths) checkFUSE() Check {
	c := h.checkFilesystem("fuse", "FUSE", "modprobe fuse")
	if !c.OK {
		return c
	}
	fd, err := unix.Open(h.p("/dev/fuse"), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		c.OK, c.Detail = false, fmt.Sprintf("cannot open /dev/fuse: %v (in a container: pass the device in)", err)
		return c
	}
	unix.Close(fd)
	c.Detail = "/dev/fuse opens read-write"
	return c
}

// cgroupV2 reports whether the cgroup mount is the unified hierarchy.
func (h hostPaths) cgroupV2() bool {
	_, err := os.Stat(h.p("/sys/fs/cgroup/cgroup.controllers"))
	return err == nil
}

func (h hostPaths) checkPids() Check {
	c := Check{Name: "cgroup pids controller"}
	if h.cgroupV2() {
		ctl, _ := h.read("/sys/fs/cgroup/cgroup.controllers")
		for _, f := range strings.Fields(ctl) {
			if f == "pids" {
				c.OK, c.Detail = true, "cgroup v2 with pids"
				return c
			}
		}
		c.Detail = "cgroup v2 without the pids controller in /sys/fs/cgroup/cgroup.controllers: enable it"
		return c
	}
	if st, err := os.Stat(h.p("/sys/fs/cgroup/pids")); err == nil && st.IsDir() {
		c.OK, c.Detail = true, "cgroup v1 pids hierarchy at /sys/fs/cgroup/pids"
		return c
	}
	c.Detail = "no cgroup pids controller (neither v2 cgroup.controllers nor v1 /sys/fs/cgroup/pids): mount it"
	return c
}

func (h hostPaths) checkFreezer() Check {
	c := Check{Name: "cgroup freezer"}
	if h.cgroupV2() {
		c.OK, c.Detail = true, "cgroup v2 (cgroup.freeze)"
		return c
	}
	if st, err := os.Stat(h.p("/sys/fs/cgroup/freezer")); err == nil && st.IsDir() {
		c.OK, c.Detail = true, "cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer"
		return c
	}
	c.Detail = "no cgroup freezer (snapshots freeze the sandbox): mount the v1 freezer hierarchy or use cgroup v2"
	return c
}

func (h hostPaths) checkSeccomp() Check {
	c := Check{Name: "seccomp filter"}
	if !nsinit.FilterSupported() {
		c.Detail = "no seccomp filter for this architecture (amd64 only)"
		return c
	}
	if _, err := os.Stat(h.p("/proc/sys/kernel/seccomp/actions_avail")); err != nil {
		c.Detail = "the kernel has no seccomp filters (/proc/sys/kernel/seccomp missing)"
		return c
	}
	c.OK, c.Detail = true, "seccomp filters available"
	return c
}

func (h hostPaths) checkUserns() Check {
	c := Check{Name: "unprivileged user namespaces"}
	if v, err := h.read("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && v != "1" {
		c.Detail = "kernel.unprivileged_userns_clone is " + v + ": sysctl -w kernel.unprivileged_userns_clone=1"
		return c
	}
	if v, err := h.read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil && v == "1" {
		c.Detail = "AppArmor restricts unprivileged user namespaces: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
		return c
	}
	c.OK, c.Detail = true, "allowed"
	return c
}

func (h hostPaths) checkMaxUserns() Check {
	c := Check{Name: "user.max_user_namespaces"}
	v, err := h.read("/proc/sys/user/max_user_namespaces")
	if err != nil {
		c.Detail = "cannot read /proc/sys/user/max_user_namespaces: the kernel may lack user namespaces"
		return c
	}
	if n, _ := strconv.Atoi(v); n <= 0 {
		c.Detail = "user.max_user_namespaces is " + v + ": sysctl -w user.max_user_namespaces=15000"
		return c
	}
	c.OK, c.Detail = true, v
	return c
}

// kvmAPIVersion is the only KVM API version there is.
const kvmAPIVersion = 12

func (h hostPaths) checkKVM() Check {
	c := Check{Name: "/dev/kvm"}
	fd, err := unix.Open(h.p("/dev/kvm"), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		c.Detail = fmt.Sprintf("cannot open /dev/kvm: %v (enable virtualisation, load kvm_intel or kvm_amd, or add the user to group kvm)", err)
		return c
	}
	defer unix.Close(fd)
	const kvmGetAPIVersion = 0xAE00
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil || v != kvmAPIVersion {
		c.Detail = fmt.Sprintf("/dev/kvm opens but KVM_GET_API_VERSION gave %d, %v (want %d): not a KVM device", v, err, kvmAPIVersion)
		return c
	}
	c.OK, c.Detail = true, "KVM API version 12"
	return c
}

// probeUserns says whether sandboxes run in a user namespace here, and
// why not, by setting one up as a runtime does.
func probeUserns() Check {
	c := Check{Name: "user namespace"}
	m, err := newIDMap()
	if err != nil {
		c.Detail = "sandboxes run without one (root in a sandbox is host root, with reduced capabilities): " + err.Error()
		return c
	}
	unix.Close(m.userns)
	unix.Close(m.lower)
	c.OK = true
	c.Detail = fmt.Sprintf("sandbox uids and gids 0..%d are host %d..%d", m.size-1, m.base, m.base+m.size-1)
	return c
}

// kernelAtLeast compares a kernel release ("6.18.0-foo") with major.minor.
func kernelAtLeast(rel string, major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(strings.TrimSpace(rel), "%d.%d", &a, &b); err != nil {
		return false
	}
	return a > major || a == major && b >= minor
}
