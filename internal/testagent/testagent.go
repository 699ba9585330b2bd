// Package testagent is the TestMain of packages whose tests start
// sandboxes: it builds the static guest agent they run.
package testagent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"tine/sandbox/ns"
)

// Main runs ns.Init (the test binary is also a sandbox's init step),
// builds cmd/tine-agent static into a temporary directory, sets *path to
// it, runs the tests and exits with their code.
func Main(m *testing.M, path *string) {
	ns.Init()
	dir, err := os.MkdirTemp("", "tine-test-agent")
	if err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n", err)
		os.Exit(1)
	}
	*path = filepath.Join(dir, "tine-agent")
	cmd := exec.Command("go", "build", "-o", *path, "tine/cmd/tine-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// InitPID returns the host pid of pid 1 of the running sandbox name: the
// process of its pids cgroup that is pid 1 in its own namespace.
func InitPID(t testing.TB, name string) int {
	t.Helper()
	procs, _ := filepath.Glob("/sys/fs/cgroup/pids/tine/tine-*-" + name + "/cgroup.procs")
	if len(procs) != 1 {
		t.Fatalf("pids cgroup of sandbox %s: %v", name, procs)
	}
	b, err := os.ReadFile(procs[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		st, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if ns, ok := strings.CutPrefix(line, "NSpid:"); ok && strings.HasSuffix(strings.TrimSpace(ns), "\t1") {
				pid, _ := strconv.Atoi(f)
				return pid
			}
		}
	}
	t.Fatalf("no pid 1 among sandbox %s's processes %q", name, b)
	return 0
}
