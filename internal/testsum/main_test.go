package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/internal/syncbuf"
)

// module writes a Go module with one test file into a temporary directory
// and returns the directory.
func module(t *testing.T, test string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module m\n\ngo 1.21\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "m_test.go"), []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// goTest runs go test -json in dir and returns its output.
func goTest(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"test", "-json", "-count=1"}, args...)...)
	cmd.Dir = dir
	out, _ := cmd.Output() // a failing run exits 1; its JSON is what counts
	if len(out) == 0 {
		t.Fatalf("go test printed nothing in %s", dir)
	}
	return out
}

func TestCountsAndSkipReasons(t *testing.T) {
	dir := module(t, `package m
import "testing"
func TestPass(t *testing.T) { t.Run("sub", func(t *testing.T) {}) }
func TestFail(t *testing.T) { t.Log("the reason it failed"); t.Fail() }
func TestSkip(t *testing.T) { t.Skip("no widget on this machine") }
`)
	var out bytes.Buffer
	code := summarize(bytes.NewReader(goTest(t, dir, ".")), &out, nil)
	s := out.String()
	if code != 1 {
		t.Errorf("exit %d with a failed test, want 1", code)
	}
	for _, want := range []string{"2 passed, 1 failed, 1 skipped", "--- FAIL m TestFail", "the reason it failed", "no widget on this machine"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	// The failure is repeated after the skipped tests, where the tail of
	// a long run shows it.
	_, end, _ := strings.Cut(s, "no widget on this machine")
	if !strings.Contains(end, "--- FAIL m TestFail") || !strings.Contains(end, "the reason it failed") {
		t.Errorf("the report's end, after the skipped tests, does not repeat the failure:\n%s", end)
	}
}

func TestTimedOutTestIsFailedWithItsOutput(t *testing.T) {
	dir := module(t, `package m
import ("testing"; "time")
func TestQuick(t *testing.T) {}
func TestHangs(t *testing.T) { t.Log("waiting for something"); time.Sleep(time.Minute) }
`)
	var out bytes.Buffer
	code := summarize(bytes.NewReader(goTest(t, dir, "-timeout", "3s", ".")), &out, nil)
	s := out.String()
	if code != 1 {
		t.Errorf("exit %d after a timeout, want 1", code)
	}
	for _, want := range []string{"1 passed, 1 failed, 0 skipped", "--- FAIL m TestHangs", "waiting for something", "did not finish"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}

func TestRerunClearsAFlakyTestOnly(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran-once")
	dir := module(t, `package m
import ("os"; "testing")
func TestFlaky(t *testing.T) {
	if _, err := os.Stat(`+"`"+marker+"`"+`); err != nil {
		os.WriteFile(`+"`"+marker+"`"+`, nil, 0o644)
		t.Fatal("first run fails")
	}
}
func TestFine(t *testing.T) {}
`)
	rerun := []string{"go", "test", "-json", "-count=1"}
	// The rerun's stderr and the report are written at once.
	out := &syncbuf.Buffer{}
	first := goTest(t, dir, "./...")
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	code := summarize(bytes.NewReader(first), out, rerun)
	s := out.String()
	if code != 0 {
		t.Errorf("exit %d although the failed test passed on its rerun:\n%s", code, s)
	}
	for _, want := range []string{"rerunning in m: TestFlaky", "flaky tests (1)", "--- FLAKY m TestFlaky", "first run fails", "2 passed, 0 failed, 0 skipped"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}

	// A test that fails every time fails the run, rerun or not.
	always := module(t, `package m
import "testing"
func TestBroken(t *testing.T) { t.Fatal("broken every time") }
`)
	if err := os.Chdir(always); err != nil {
		t.Fatal(err)
	}
	out = &syncbuf.Buffer{}
	code = summarize(bytes.NewReader(goTest(t, always, "./...")), out, rerun)
	s = out.String()
	if code != 1 {
		t.Errorf("exit %d for a test that fails on its rerun too, want 1:\n%s", code, s)
	}
	for _, want := range []string{"--- FAIL again m TestBroken", "0 passed, 1 failed"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}

func TestBuildErrorIsNotRerun(t *testing.T) {
	dir := module(t, `package m
import "testing"
func TestX(t *testing.T) { undefined() }
`)
	var out bytes.Buffer
	code := summarize(bytes.NewReader(goTest(t, dir, ".")), &out, []string{"false"})
	if code != 1 {
		t.Errorf("exit %d for a package that does not build, want 1:\n%s", code, out.String())
	}
	if strings.Contains(out.String(), "rerunning") {
		t.Errorf("a build failure was rerun:\n%s", out.String())
	}
}

func TestNothingRanFails(t *testing.T) {
	var out bytes.Buffer
	code := summarize(strings.NewReader("go: cannot find main module\n"), &out, nil)
	if code != 1 || !strings.Contains(out.String(), "ran nothing") {
		t.Errorf("exit %d for a stream with no result:\n%s", code, out.String())
	}
}
