// Command testsum reads `go test -json` output on standard input and prints
// a readable report: the output of every failed test, every skipped test
// with its reason, and a closing line "N passed, N failed, N skipped". It
// exits 1 when a test or a package failed.
//
// A test that started but never ended in a package that failed (a test
// binary that timed out or crashed) counts as failed, and its output is
// printed with the rest.
//
// Given a go test command line after "--", testsum runs each failed test
// once more, alone in its package, with that command and "-run":
//
//	go test -json ./... | go run ./internal/testsum -- go test -json -count=1
//
// A test that passes on its rerun is listed as flaky, with its first
// output, and counts as passed; one that fails again fails the run. A
// package that failed with no failed test to name (a build error) is not
// rerun.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

func main() {
	var rerun []string
	if len(os.Args) > 1 {
		if os.Args[1] != "--" || len(os.Args) < 3 {
			fmt.Fprintln(os.Stderr, "usage: testsum [-- go test -json ARGS...] < go-test-json-output")
			os.Exit(2)
		}
		rerun = os.Args[2:]
	}
	os.Exit(summarize(os.Stdin, os.Stdout, rerun))
}

// results is what one `go test -json` stream said.
type results struct {
	// packages counts the packages that ended (passed, failed or
	// skipped): a stream without any ran nothing.
	packages   int
	outputs    map[key]*strings.Builder
	passed     []key
	failed     []key
	skipped    []key
	failedPkgs []string
}

// read parses a `go test -json` stream. Plain lines (build errors) and
// package-level lines go to echo as they come.
func read(in io.Reader, echo io.Writer) *results {
	r := &results{outputs: map[key]*strings.Builder{}}
	running := map[key]bool{}
	var order []key
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			fmt.Fprintln(echo, string(line))
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "run":
			if e.Test != "" && !running[k] {
				running[k] = true
				order = append(order, k)
			}
		case "output":
			b := r.outputs[k]
			if b == nil {
				b = &strings.Builder{}
				r.outputs[k] = b
			}
			b.WriteString(e.Output)
			if e.Test == "" && !strings.HasPrefix(e.Output, "=== ") {
				fmt.Fprint(echo, e.Output) // package-level lines: ok/FAIL/no test files
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				r.packages++
				if e.Action == "fail" {
					r.failedPkgs = append(r.failedPkgs, e.Package)
				}
				break
			}
			delete(running, k)
			switch e.Action {
			case "pass":
				r.passed = append(r.passed, k)
			case "fail":
				r.failed = append(r.failed, k)
			case "skip":
				r.skipped = append(r.skipped, k)
			}
		}
	}
	// Tests left running when their package failed did not finish: the
	// binary timed out or crashed under them.
	failedPkg := map[string]bool{}
	for _, p := range r.failedPkgs {
		failedPkg[p] = true
	}
	for _, k := range order {
		if running[k] && failedPkg[k.pkg] {
			r.failed = append(r.failed, k)
			b := r.outputs[k]
			if b == nil {
				b = &strings.Builder{}
				r.outputs[k] = b
			}
			b.WriteString("(did not finish: the test binary timed out or crashed; the package output above says which)\n")
		}
	}
	return r
}

// topLevel returns the failed top-level tests of each package, and the
// failed packages that name no failed test.
func (r *results) topLevel() (tests map[string][]string, unnamed []string) {
	tests = map[string][]string{}
	seen := map[key]bool{}
	for _, k := range r.failed {
		top, _, _ := strings.Cut(k.test, "/")
		if !seen[key{k.pkg, top}] {
			seen[key{k.pkg, top}] = true
			tests[k.pkg] = append(tests[k.pkg], top)
		}
	}
	for _, p := range r.failedPkgs {
		if len(tests[p]) == 0 {
			unnamed = append(unnamed, p)
		}
	}
	return tests, unnamed
}

func summarize(in io.Reader, out io.Writer, rerun []string) int {
	r := read(in, out)
	flaky := map[key]bool{}
	failedAgain := map[string]bool{}
	tests, unnamed := r.topLevel()
	if len(rerun) > 0 && len(tests) > 0 {
		pkgs := make([]string, 0, len(tests))
		for p := range tests {
			pkgs = append(pkgs, p)
		}
		sort.Strings(pkgs)
		for _, p := range pkgs {
			names := tests[p]
			pattern := "^(" + strings.Join(quoteAll(names), "|") + ")$"
			fmt.Fprintf(out, "\nrerunning in %s: %s\n", p, strings.Join(names, " "))
			args := append(append([]string{}, rerun[1:]...), "-run", pattern, p)
			cmd := exec.Command(rerun[0], args...)
			cmd.Stderr = out
			pipe, err := cmd.StdoutPipe()
			if err != nil {
				fmt.Fprintf(out, "rerun: %v\n", err)
				return 1
			}
			if err := cmd.Start(); err != nil {
				fmt.Fprintf(out, "rerun %s: %v\n", rerun[0], err)
				return 1
			}
			again := read(pipe, out)
			cmd.Wait()
			passedAgain := map[string]bool{}
			for _, k := range again.passed {
				if !strings.Contains(k.test, "/") {
					passedAgain[k.test] = true
				}
			}
			for _, name := range names {
				if passedAgain[name] && len(again.failedPkgs) == 0 {
					flaky[key{p, name}] = true
				} else {
					failedAgain[p] = true
					fmt.Fprintf(out, "--- FAIL again %s %s\n%s", p, name, again.outputs[key{p, name}])
				}
			}
		}
	}

	var failed []key
	flakyFirst := map[key]bool{}
	for _, k := range r.failed {
		top, _, _ := strings.Cut(k.test, "/")
		if flaky[key{k.pkg, top}] {
			flakyFirst[k] = true
			continue
		}
		failed = append(failed, k)
	}
	for _, k := range failed {
		fmt.Fprintf(out, "\n--- FAIL %s %s\n%s", k.pkg, k.test, r.outputs[k])
	}
	passed := len(r.passed)
	if len(flaky) > 0 {
		fmt.Fprintf(out, "\nflaky tests (%d): failed once, passed when run again; their first output:\n", len(flaky))
		for _, k := range r.failed {
			if flakyFirst[k] {
				fmt.Fprintf(out, "\n--- FLAKY %s %s\n%s", k.pkg, k.test, r.outputs[k])
			}
		}
		// Each flaky top-level test counts once, as passed.
		passed += len(flaky)
	}
	if len(r.skipped) > 0 {
		fmt.Fprintf(out, "\nskipped tests (%d):\n", len(r.skipped))
		sort.Slice(r.skipped, func(i, j int) bool {
			return r.skipped[i].pkg+r.skipped[i].test < r.skipped[j].pkg+r.skipped[j].test
		})
		for _, k := range r.skipped {
			fmt.Fprintf(out, "  %s %s: %s\n", k.pkg, k.test, skipReason(r.outputs[k]))
		}
	}
	for _, p := range unnamed {
		fmt.Fprintf(out, "\npackage %s failed with no failed test to name (build error or TestMain); see its output above\n", p)
	}
	// The failures' last lines again, last: a reader of the run's tail
	// sees why it failed without its whole output.
	if len(failed) > 0 {
		fmt.Fprintf(out, "\nfailed tests (%d), the end of each one's output:\n", len(failed))
		for _, k := range failed {
			fmt.Fprintf(out, "--- FAIL %s %s\n%s", k.pkg, k.test, tail(r.outputs[k], digestLines, digestWidth))
		}
	}
	if r.packages == 0 {
		fmt.Fprintln(out, "\nno package reported a result: go test ran nothing (see its output above)")
		return 1
	}
	fmt.Fprintf(out, "\n%d passed, %d failed, %d skipped\n", passed, len(failed), len(r.skipped))
	if len(failed) > 0 || len(unnamed) > 0 || len(failedAgain) > 0 {
		return 1
	}
	// A package that failed is cleared only by the rerun of every test
	// it named.
	for _, p := range r.failedPkgs {
		if len(tests[p]) == 0 || failedAgain[p] {
			return 1
		}
	}
	return 0
}

// digestLines and digestWidth bound the end of a failed test's output
// that the closing digest repeats.
const (
	digestLines = 12
	digestWidth = 240
)

// tail returns the last n non-empty lines of b, each cut to width bytes.
func tail(b *strings.Builder, n, width int) string {
	if b == nil {
		return ""
	}
	var keep []string
	lines := strings.Split(b.String(), "\n")
	for i := len(lines) - 1; i >= 0 && len(keep) < n; i-- {
		l := strings.TrimRight(lines[i], " \t\r")
		if l == "" {
			continue
		}
		if len(l) > width {
			l = l[:width] + "..."
		}
		keep = append(keep, l)
	}
	slices.Reverse(keep)
	if len(keep) == 0 {
		return ""
	}
	return strings.Join(keep, "\n") + "\n"
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = regexp.QuoteMeta(n)
	}
	return out
}

// skipReason picks the message a test gave to t.Skip out of its output.
func skipReason(b *strings.Builder) string {
	if b == nil {
		return "(no reason given)"
	}
	var reason []string
	for _, l := range strings.Split(b.String(), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		reason = append(reason, l)
	}
	if len(reason) == 0 {
		return "(no reason given)"
	}
	return strings.Join(reason, " | ")
}
