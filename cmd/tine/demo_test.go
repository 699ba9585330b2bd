package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoScript runs the main job (demo/run.sh, what "make demo" runs)
// end to end with the tine built for these tests, and checks its story:
// the tests fail at first, three forks each serve port 8080, the forks'
// diffs differ, a rollback undoes a change, and the fork that passes and
// keeps its tests is promoted into the project, whose tests then pass.
func TestDemoScript(t *testing.T) {
	work := t.TempDir()
	root := filepath.Join(work, "root")
	t.Cleanup(func() { exec.Command(tineBin, "--root", root, "serve", "--stop").Run() })
	cmd := exec.Command("bash", filepath.Join("..", "..", "demo", "run.sh"))
	cmd.Env = append(os.Environ(), "TINE="+tineBin, "TINE_DEMO_DIR="+work)
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{
		"FAIL\texample.com/mean", // the tests fail in the first sandbox
		"$ tine fork agent -n 3 --names try-1,try-2,try-3",
		"D mean_test.go",                    // try-3's diff shows the deleted test
		"sandbox try-1 is at snapshot good", // the rollback
		"Promote try-1",
		"applied 1 changes",
		" M mean.go", // git status of the project after the promote
		"Clean it up:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if n := strings.Count(out, "8080"); n < 3 {
		t.Errorf("port 8080 shown %d times, want one per fork\n%s", n, out)
	}
	// The host's copy passes its tests after the promote.
	if !strings.Contains(sectionAfter(out, "(on the host"), "ok  \texample.com/mean") {
		t.Errorf("the promoted project's tests did not pass on the host\n%s", out)
	}
	if t.Failed() {
		t.Log(out)
	}
}

// sectionAfter returns what follows the first line holding marker.
func sectionAfter(s, marker string) string {
	i := strings.Index(s, marker)
	if i < 0 {
		return ""
	}
	return s[i:]
}
