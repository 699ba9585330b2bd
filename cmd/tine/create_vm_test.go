package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
	"tine/sandbox"
	"tine/sandbox/vm"
)

// TestCreateRuntimeVMRefused: where this host cannot run vm sandboxes,
// create --runtime vm is refused with the probe's reason before any
// daemon is reached; an unknown runtime is a usage error.
func TestCreateRuntimeVMRefused(t *testing.T) {
	p := vm.Probe()
	c := cli{t: t, root: filepath.Join(t.TempDir(), "root")}
	_, errOut, code := c.run("", "create", "--runtime", "vm", "--memory", "2G", "--cpus", "2")
	if code == 0 || !strings.Contains(errOut, "vm sandbox") {
		t.Fatalf("create --runtime vm: exit %d: %s", code, errOut)
	}
	if p.Support != vm.Native && !strings.Contains(errOut, p.Detail) {
		t.Errorf("refusal does not give the probe's reason %q: %s", p.Detail, errOut)
	}
	if _, errOut, code = c.run("", "create", "--runtime", "xen"); code == 0 || !strings.Contains(errOut, "want ns or vm") {
		t.Errorf("create --runtime xen: exit %d: %s", code, errOut)
	}
}

// TestCreateRuntimeVMDaemonWithout: past the host check ($TINE_VM=on), a
// daemon that runs no vm runtime (here: no guest kernel given) refuses
// create --runtime vm, naming the runtimes it has, and makes nothing.
func TestCreateRuntimeVMDaemonWithout(t *testing.T) {
	t.Setenv(EnvVM, "on")
	t.Setenv("TINE_VM_KERNEL", "")
	base := t.TempDir()
	c := cli{t: t, root: filepath.Join(base, "root")}
	c.ok("init")
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(c.root, api.SocketName)); err == nil {
			c.stopDaemon()
		}
	})
	project := filepath.Join(base, "p")
	if err := os.MkdirAll(project, 0o755); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := c.run("", "create", "--runtime", "vm", "--from", project, "--name", "v")
	if code == 0 || !strings.Contains(errOut, `runtime "vm" is not one this manager runs`) {
		t.Fatalf("create --runtime vm on a daemon without it: exit %d: %s", code, errOut)
	}
	if out, _, _ := c.run("", "ls"); strings.Contains(out, "v") && strings.Contains(out, "running") {
		t.Fatalf("a refused create left a sandbox: %s", out)
	}
	if _, errOut, code := c.run("", "create", "--runtime", "ns", "--from", project, "--name", "n"); code != 0 {
		t.Fatalf("create --runtime ns: exit %d: %s", code, errOut)
	}
}

// TestCreateVMGuestFromFlags: for --runtime vm, --memory and --cpus (the
// limit flags of limits.go) become the guest size and leave the cgroup
// limits; fractional vCPUs are refused; ns keeps them as limits.
func TestCreateVMGuestFromFlags(t *testing.T) {
	vf := vmFlags{runtime: "vm"}
	req := api.CreateRequest{Limits: sandbox.Limits{Pids: 9, LimitsExt: sandbox.LimitsExt{MemoryBytes: 2 << 30, CPUs: 2}}}
	if err := vf.guest(&req); err != nil {
		t.Fatal(err)
	}
	if req.Guest == nil || *req.Guest != (sandbox.GuestSize{MemoryBytes: 2 << 30, CPUs: 2}) {
		t.Fatalf("guest %+v", req.Guest)
	}
	if req.Limits.MemoryBytes != 0 || req.Limits.CPUs != 0 || req.Limits.Pids != 9 {
		t.Fatalf("limits left %+v", req.Limits)
	}
	req = api.CreateRequest{Limits: sandbox.Limits{LimitsExt: sandbox.LimitsExt{CPUs: 0.5}}}
	if err := vf.guest(&req); err == nil || !strings.Contains(err.Error(), "whole number") {
		t.Fatalf("--cpus 0.5 for vm: %v", err)
	}
	ns := vmFlags{runtime: "ns"}
	req = api.CreateRequest{Limits: sandbox.Limits{LimitsExt: sandbox.LimitsExt{MemoryBytes: 1 << 30}}}
	if err := ns.guest(&req); err != nil || req.Guest != nil || req.Limits.MemoryBytes != 1<<30 {
		t.Fatalf("ns: %+v %v", req, err)
	}
}
