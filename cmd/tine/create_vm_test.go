package main

import (
	"path/filepath"
	"strings"
	"testing"

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
