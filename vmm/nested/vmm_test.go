package nested

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestVMMUnderKVM runs package vmm's tests (bare guests: forks, limits,
// snapshots, userfaultfd, fault containment) in L1 on a real KVM. The test
// binary is built here, and run here once first so that it builds its
// guests with this machine's gcc into a directory shipped to L1, which has
// no compiler. TINE_VMM_RUN, when set, is passed as -test.run, and
// TINE_VMM_COUNT as L1's -test.count (to repeat a rare failure). A test
// that fails in L1 runs once more there (see rerunFailed). With
// TINE_VMM_KVMTRACE=1, L1 records KVM's tracepoints, stops at the first
// failure, and prints the last trace lines.
func TestVMMUnderKVM(t *testing.T) {
	if os.Getenv(EnvEnable) == "" {
		t.Skipf("nested QEMU runs take minutes: set %s=1 (make nested-test) to run them", EnvEnable)
	}
	p, err := prerequisites(nil)
	if err != nil {
		t.Skipf("%v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "vmm.test")
	build := exec.Command(p.goTool, "test", "-c", "-o", bin, "tine/vmm")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c tine/vmm: %v\n%s", err, out)
	}
	guests := filepath.Join(dir, "guests")
	if err := os.Mkdir(guests, 0o755); err != nil {
		t.Fatal(err)
	}
	run := os.Getenv("TINE_VMM_RUN")
	args := []string{"-test.count=1"}
	if run != "" {
		args = append(args, "-test.run", run)
	}
	host := exec.Command(bin, args...)
	host.Env = append(os.Environ(), "TINE_VMM_GUESTS="+guests)
	if out, err := host.CombinedOutput(); err != nil {
		t.Fatalf("vmm tests on this host (to build the guests): %v\n%s", err, out)
	}
	files := []File{{Path: "vmm.test", HostPath: bin, Mode: 0o755}}
	built, err := os.ReadDir(guests)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range built {
		files = append(files, File{Path: "guests/" + e.Name(), HostPath: filepath.Join(guests, e.Name())})
	}
	count := "1"
	if c := os.Getenv("TINE_VMM_COUNT"); c != "" {
		count = c
	}
	test := "./vmm.test -test.v -test.timeout 7m -test.count=" + count
	if run != "" {
		test += " -test.run '" + run + "'"
	}
	if os.Getenv("TINE_VMM_KVMTRACE") != "" {
		test = kvmTrace(test)
	}
	script := "export TINE_VMM_GUESTS=/work/guests\n" + rerunFailed(test, "./vmm.test", "2m")
	out := RunTest(context.Background(), t, Options{Script: script, Files: files, Timeout: 10 * time.Minute})
	first, _, _ := strings.Cut(out, rerunMarker)
	passed := regexp.MustCompile(`(?m)^--- PASS: \S+`).FindAllString(first, -1)
	t.Logf("%d tests passed in L1:\n%s", len(passed), strings.Join(passed, "\n"))
	if len(passed) == 0 || strings.Contains(first, "--- SKIP") {
		t.Fatalf("vmm tests in L1 did not all run (L1's whole output is logged above):\n%s", notPassed(first))
	}
	checkL1(t, out, nil)
}

// kvmTrace wraps an L1 test command: KVM's tracepoints are recorded
// while it runs, it stops at its first failure, and its exit prints the
// trace's last lines (what KVM did just before the failure).
func kvmTrace(cmd string) string {
	return `T=/sys/kernel/tracing
mount -t tracefs nodev $T
echo 16384 > $T/buffer_size_kb
for e in kvm_exit kvm_entry kvm_page_fault kvm_inj_exception kvm_emulate_insn kvm_userspace_exit kvm_pio kvm_fpu kvm_nested_vmexit; do
	echo 1 > $T/events/kvm/$e/enable 2>/dev/null
done
echo 1 > $T/tracing_on
` + cmd + ` -test.failfast
rc=$?
echo 0 > $T/tracing_on
if [ $rc != 0 ]; then echo "=== KVM trace, last lines"; tail -n 300 $T/trace; fi
exit $rc
`
}
