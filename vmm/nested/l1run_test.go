package nested

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// rerunMarker starts the rerun of the tests that failed in L1.
const rerunMarker = "TINE-L1-RERUN: "

// rerunFailed wraps an L1 go test command: when it fails, the top-level
// tests that failed, or were running when it timed out, run once more
// (the test binary bin), after rerunMarker and their names, with
// -test.timeout limit. Rare failures of the emulated machine (forks
// of VMs in L1 on QEMU's software SVM; docs/nested.md) then cost one
// test's time instead of the whole run's; a test that fails twice still
// fails (checkL1).
func rerunFailed(test, bin, limit string) string {
	return `(` + test + `; echo "TINE-L1-RC $?") 2>&1 | tee /tmp/first.out
if ! grep -q '^TINE-L1-RC 0$' /tmp/first.out; then
	failed=$( (grep '^--- FAIL: ' /tmp/first.out | awk '{print $3}'
		awk '/running tests:/ {f = 1; next} f && /^\t\t/ {split($1, a, "/"); print a[1]; next} {f = 0}' /tmp/first.out) |
		sort -u | tr '\n' '|' | sed 's/|$//')
	if [ -n "$failed" ]; then
		echo "` + rerunMarker + `$failed"
		` + bin + ` -test.v -test.timeout ` + limit + ` -test.count=1 -test.run "^($failed)\$"
	fi
fi
`
}

// checkL1 fails t unless the L1 run in out (made with rerunFailed) ended,
// each test of want passed, and each test that failed passed on its
// rerun; it logs those as FLAKY.
func checkL1(t *testing.T, out string, want []string) {
	t.Helper()
	flaky, err := l1Verdict(out, want)
	if err != nil {
		t.Fatal(err)
	}
	if len(flaky) > 0 {
		first, _, _ := strings.Cut(out, rerunMarker)
		t.Logf("FLAKY in L1 (failed, then passed on a rerun): %s\n%s", strings.Join(flaky, ", "), notPassed(first))
	}
}

// l1Verdict is checkL1's judgment: the tests that failed and then passed
// on their rerun, or why the run fails.
func l1Verdict(out string, want []string) (flaky []string, err error) {
	first, rerun, reran := strings.Cut(out, rerunMarker)
	if !strings.Contains(first, "TINE-L1-RC ") {
		return nil, fmt.Errorf("the tests in L1 did not end (L1's whole output is logged above):\n%s", notPassed(first))
	}
	passedIn := func(out, name string) bool {
		return regexp.MustCompile(`(?m)^--- PASS: ` + regexp.QuoteMeta(name) + ` `).MatchString(out)
	}
	if reran {
		names, _, _ := strings.Cut(rerun, "\n")
		flaky = strings.Split(strings.TrimSpace(names), "|")
		for _, name := range flaky {
			if !passedIn(rerun, name) {
				return nil, fmt.Errorf("%s failed in L1, and again on its rerun:\n%s\nrerun:\n%s", name, notPassed(first), notPassed(rerun))
			}
		}
	} else if !strings.Contains(first, "TINE-L1-RC 0") {
		return nil, fmt.Errorf("the tests in L1 failed (L1's whole output is logged above):\n%s", notPassed(first))
	}
	for _, name := range want {
		if !passedIn(first, name) && !(reran && passedIn(rerun, name)) {
			return nil, fmt.Errorf("%s did not pass in L1:\n%s", name, notPassed(out))
		}
	}
	return flaky, nil
}

// notPassed returns, from a verbose go test output, the lines of each
// test that failed or skipped: from its last "=== RUN" to its end line,
// at most 20 lines a test. With no such test it returns the last 20
// lines (a crash or a timeout).
func notPassed(out string) string {
	lines := strings.Split(out, "\n")
	end := regexp.MustCompile(`^\s*--- (FAIL|SKIP): (\S+)`)
	var b strings.Builder
	for i, l := range lines {
		m := end.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		from := max(0, i-19)
		for j := i - 1; j >= from; j-- {
			if strings.HasSuffix(strings.TrimRight(lines[j], " \r"), "=== RUN   "+m[2]) {
				from = j
				break
			}
		}
		b.WriteString(strings.Join(lines[from:i+1], "\n") + "\n")
	}
	if b.Len() == 0 {
		return strings.Join(lines[max(0, len(lines)-20):], "\n")
	}
	return b.String()
}

// TestRerunFailed runs rerunFailed's script on a fake test binary whose
// TestA fails once, and judges its output with l1Verdict; and judges
// made-up outputs of runs that crashed, failed twice or lacked a test.
func TestRerunFailed(t *testing.T) {
	dir := t.TempDir()
	fake := `#!/bin/sh
if [ ! -e seen ]; then touch seen; echo "=== RUN   TestA"; echo "--- FAIL: TestA (0.1s)"; echo "=== RUN   TestB"; echo "--- PASS: TestB (0.1s)"; echo FAIL; exit 1; fi
case "$*" in *"-test.run ^(TestA)$"*) ;; *) echo "rerun args: $*"; exit 2;; esac
echo "=== RUN   TestA"; echo "--- PASS: TestA (0.1s)"; echo PASS
`
	if err := os.WriteFile(filepath.Join(dir, "x.test"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", rerunFailed("./x.test -test.v", "./x.test", "1m"))
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("script: %v\n%s", err, b)
	}
	flaky, err := l1Verdict(string(b), []string{"TestA", "TestB"})
	if err != nil || len(flaky) != 1 || flaky[0] != "TestA" {
		t.Fatalf("l1Verdict = %v, %v, want [TestA] as flaky:\n%s", flaky, err, b)
	}
	// A run that timed out in TestA's subtest: TestA runs again.
	hang := `#!/bin/sh
if [ ! -e hung ]; then touch hung; echo "--- PASS: TestB (0.1s)"; printf 'panic: test timed out after 1s\n\trunning tests:\n\t\tTestA/sub (1s)\n\ngoroutine 1 [running]:\n'; exit 2; fi
case "$*" in *"-test.run ^(TestA)$"*) ;; *) echo "rerun args: $*"; exit 2;; esac
echo "--- PASS: TestA (0.1s)"
`
	if err := os.WriteFile(filepath.Join(dir, "y.test"), []byte(hang), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command("sh", "-c", rerunFailed("./y.test -test.v", "./y.test", "1m"))
	cmd.Dir = dir
	if b, err = cmd.CombinedOutput(); err != nil {
		t.Fatalf("script: %v\n%s", err, b)
	}
	if flaky, err = l1Verdict(string(b), []string{"TestA", "TestB"}); err != nil || len(flaky) != 1 || flaky[0] != "TestA" {
		t.Fatalf("after a timeout, l1Verdict = %v, %v, want [TestA] as flaky:\n%s", flaky, err, b)
	}
	pass := "--- PASS: TestA (1s)\nPASS\nTINE-L1-RC 0\n"
	for _, c := range []struct {
		name, out string
		want      []string
		ok        bool
	}{
		{"clean", pass, []string{"TestA"}, true},
		{"crashed", "--- PASS: TestA (1s)\npanic: test timed out\n", nil, false},
		{"failed twice", "--- FAIL: TestA (1s)\nTINE-L1-RC 1\n" + rerunMarker + "TestA\n--- FAIL: TestA (1s)\n", nil, false},
		{"failed, no rerun", "--- FAIL: TestA (1s)\nTINE-L1-RC 1\n", nil, false},
		{"missing", pass, []string{"TestA", "TestB"}, false},
	} {
		if _, err := l1Verdict(c.out, c.want); (err == nil) != c.ok {
			t.Errorf("%s: l1Verdict error %v, want ok %v", c.name, err, c.ok)
		}
	}
}

func TestNotPassed(t *testing.T) {
	out := "=== RUN   TestA\n--- PASS: TestA (0.01s)\n=== RUN   TestB\n    b_test.go:9: want 1, got 2\n--- FAIL: TestB (0.02s)\n=== RUN   TestC\n    c_test.go:3: no gcc\n--- SKIP: TestC (0.00s)\nFAIL\n"
	got := notPassed(out)
	for _, want := range []string{"b_test.go:9: want 1, got 2", "--- FAIL: TestB", "c_test.go:3: no gcc"} {
		if !strings.Contains(got, want) {
			t.Errorf("notPassed lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "TestA") {
		t.Errorf("notPassed shows the passing TestA:\n%s", got)
	}
}
