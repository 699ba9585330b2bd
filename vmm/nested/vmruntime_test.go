package nested

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"tine/sandbox/vm"
)

// TestVMRuntimeUnderKVM runs sandbox/vm's TestRuntimeGuest in L1: the vm
// sandbox runtime boots Debian's kernel with the static tine-agent as pid
// 1 of its initramfs, execs through the agent socket (bridged to vsock),
// forks the running guest into 3 clones through Freeze, CopyState and
// Start, as the sandbox manager does (each with its own TAP, MAC and
// address, which L1 reaches over TCP; each reaches its own inside API,
// an HTTP server in L1, over /run/tine/api.sock), then stops everything
// and, in a new process (a restarted daemon), clones the memory image
// saved on disk (TestRuntimeCloneInNewProcess). Each guest has a project
// directory mounted at its own path over virtio-fs: the parent reads the
// host's file and writes one that lands on the host, and each clone sees
// it in its own copy of the branch. Then TestManagerGuest drives a vm
// sandbox through sandbox.Manager over a cowfs FUSE mount in L1 (fuse
// loaded there): exec, ps, ports, diff, snapshot and rollback of the
// project, memory and disk, a fork into 2, and a promotion to L1's
// directory.
func TestVMRuntimeUnderKVM(t *testing.T) {
	if os.Getenv(EnvEnable) == "" {
		t.Skipf("nested QEMU runs take minutes: set %s=1 (make nested-test) to run them", EnvEnable)
	}
	p, err := prerequisites(nil)
	if err != nil {
		t.Skipf("%v", err)
	}
	dir := t.TempDir()
	build := func(out string, args ...string) {
		cmd := exec.Command(p.goTool, args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, b)
		}
	}
	bin := filepath.Join(dir, "vm.test")
	agent := filepath.Join(dir, "tine-agent")
	unixcat := filepath.Join(dir, "unixcat")
	build(bin, "test", "-c", "-o", bin, "tine/sandbox/vm")
	build(agent, "build", "-o", agent, "tine/cmd/tine-agent")
	build(unixcat, "build", "-ldflags=-s -w", "-o", unixcat, "tine/vmm/nested/testdata/unixcat")
	files := []File{
		{Path: "vm.test", HostPath: bin, Mode: 0o755},
		{Path: "l2/tine-agent", HostPath: agent, Mode: 0o755},
		{Path: "l2/unixcat", HostPath: unixcat, Mode: 0o755},
		{Path: "l2/vmlinux", HostPath: p.k.Vmlinux},
	}
	for _, m := range vm.VirtioModules {
		src := filepath.Join(p.k.Dir, m+".ko")
		if _, err := os.Stat(src); err != nil {
			t.Skipf("kernel module %s missing (run `make kernels`): %v", m, err)
		}
		files = append(files, File{Path: "l2/" + m + ".ko", HostPath: src})
	}
	script := rerunFailed("./vm.test -test.run '^(TestRuntimeGuest|TestManagerGuest)$' -test.v -test.timeout 4m", "./vm.test", "4m")
	script = "export TINE_VM_KERNEL=/work/l2/vmlinux TINE_VM_MODULES=/work/l2 TINE_VM_AGENT=/work/l2/tine-agent TINE_VM_BUSYBOX=/bin/busybox TINE_VM_UNIXCAT=/work/l2/unixcat\n" + script
	out := RunTest(context.Background(), t, Options{Script: script, Files: files, Timeout: 10 * time.Minute})
	checkL1(t, out, []string{"TestRuntimeGuest", "TestManagerGuest"})
}
