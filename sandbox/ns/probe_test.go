package ns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func find(t *testing.T, rs []ProbeResult, rt, mode string) ProbeResult {
	t.Helper()
	for _, r := range rs {
		if r.Runtime == rt && r.Mode == mode {
			return r
		}
	}
	t.Fatalf("no probe result for %s/%s in %+v", rt, mode, rs)
	return ProbeResult{}
}

// TestProbeHost: on this host (root, overlayfs, FUSE, cgroup v1, no
// /dev/kvm) the ns runtime runs as root, rootless is refused with its
// reason, and the vm runtime is refused naming /dev/kvm.
func TestProbeHost(t *testing.T) {
	rs := Probe()
	for _, r := range rs {
		t.Logf("%s/%s ok=%v why=%q", r.Runtime, r.Mode, r.OK, r.Why)
	}
	root := find(t, rs, "ns", "root")
	if os.Geteuid() == 0 && !root.OK {
		t.Errorf("ns/root refused as root: %q", root.Why)
	}
	// This host allows unprivileged user namespaces and overlays in them.
	if rl := find(t, rs, "ns", "rootless"); !rl.OK {
		t.Errorf("ns/rootless refused: %+v", rl)
	}
	if os.Geteuid() == 0 && !hasCheck(root, "in use") {
		t.Errorf("ns/root as root does not say it is in use: %+v", root)
	}
	vm := find(t, rs, "vm", "kvm")
	if vm.OK || !strings.Contains(strings.Join(vm.Why, "\n"), "in VMs yet") {
		t.Errorf("vm sandboxes are not built, yet the probe offers them: %+v", vm)
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		if vm.OK || !strings.Contains(strings.Join(vm.Why, "\n"), "/dev/kvm") {
			t.Errorf("vm without /dev/kvm: %+v", vm)
		}
	}
}

// TestProbeMissing: on a bare tree, as a user without capabilities, each
// missing prerequisite is named with what to do.
func TestProbeMissing(t *testing.T) {
	dir := t.TempDir()
	uid, caps := 1000, uint64(0)
	os.MkdirAll(filepath.Join(dir, "proc/sys/kernel"), 0o755)
	os.MkdirAll(filepath.Join(dir, "proc/sys/user"), 0o755)
	os.WriteFile(filepath.Join(dir, "proc/filesystems"), []byte("nodev\tproc\n\text4\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "proc/sys/kernel/unprivileged_userns_clone"), []byte("0\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "proc/sys/user/max_user_namespaces"), []byte("0\n"), 0o644)
	os.MkdirAll(filepath.Join(dir, "dev"), 0o755)
	os.WriteFile(filepath.Join(dir, "dev/kvm"), nil, 0o644) // not a device
	rs := probeAt(hostPaths{root: dir, euid: &uid, caps: &caps})
	root := find(t, rs, "ns", "root")
	why := strings.Join(root.Why, "\n")
	for _, want := range []string{"root or CAP_SYS_ADMIN", "overlay is not in /proc/filesystems", "fuse is not in", "pids", "freezer"} {
		if !strings.Contains(why, want) {
			t.Errorf("ns/root why lacks %q:\n%s", want, why)
		}
	}
	if root.OK {
		t.Error("ns/root OK on a bare tree")
	}
	rl := strings.Join(find(t, rs, "ns", "rootless").Why, "\n")
	for _, want := range []string{"unprivileged_userns_clone=1", "max_user_namespaces", "FUSE for users"} {
		if !strings.Contains(rl, want) {
			t.Errorf("ns/rootless why lacks %q:\n%s", want, rl)
		}
	}
	if vm := find(t, rs, "vm", "kvm"); vm.OK || !strings.Contains(strings.Join(vm.Why, ""), "KVM_GET_API_VERSION") {
		t.Errorf("vm with a plain file as /dev/kvm: %+v", vm)
	}
}

// TestProbeComplete: a tree with every prerequisite passes for ns/root.
func TestProbeComplete(t *testing.T) {
	dir := t.TempDir()
	uid, caps := 0, uint64(1)<<capSysAdmin
	for _, d := range []string{"proc/sys/kernel/seccomp", "sys/fs/cgroup/pids", "sys/fs/cgroup/freezer", "dev"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "proc/filesystems"), []byte("nodev\toverlay\nnodev\tfuse\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "proc/sys/kernel/seccomp/actions_avail"), []byte("kill_process allow\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "dev/fuse"), nil, 0o666)
	root := find(t, probeAt(hostPaths{root: dir, euid: &uid, caps: &caps}), "ns", "root")
	if !root.OK {
		t.Fatalf("ns/root refused: %q", root.Why)
	}
}

func hasCheck(r ProbeResult, name string) bool {
	for _, c := range r.Checks {
		if c.Name == name {
			return true
		}
	}
	return false
}
