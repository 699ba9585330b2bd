// Command testsum reads `go test -json` output on standard input and prints
// a readable report: the output of every failed test, every skipped test
// with its reason, and a closing line "N passed, N failed, N skipped". It
// exits 1 when a test or a package failed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
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
	os.Exit(summarize(os.Stdin, os.Stdout))
}

func summarize(in io.Reader, out io.Writer) int {
	outputs := map[key]*strings.Builder{}
	var passed, failed, skipped []key
	var failedPkgs []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, string(line)) // build errors and other plain text
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			b := outputs[k]
			if b == nil {
				b = &strings.Builder{}
				outputs[k] = b
			}
			b.WriteString(e.Output)
			if e.Test == "" && !strings.HasPrefix(e.Output, "=== ") {
				fmt.Fprint(out, e.Output) // package-level lines: ok/FAIL/no test files
			}
		case "pass":
			if e.Test != "" {
				passed = append(passed, k)
			}
		case "fail":
			if e.Test != "" {
				failed = append(failed, k)
			} else {
				failedPkgs = append(failedPkgs, e.Package)
			}
		case "skip":
			if e.Test != "" {
				skipped = append(skipped, k)
			}
		}
	}
	for _, k := range failed {
		fmt.Fprintf(out, "\n--- FAIL %s %s\n%s", k.pkg, k.test, outputs[k])
	}
	if len(skipped) > 0 {
		fmt.Fprintf(out, "\nskipped tests (%d):\n", len(skipped))
		sort.Slice(skipped, func(i, j int) bool { return skipped[i].pkg+skipped[i].test < skipped[j].pkg+skipped[j].test })
		for _, k := range skipped {
			fmt.Fprintf(out, "  %s %s: %s\n", k.pkg, k.test, skipReason(outputs[k]))
		}
	}
	fmt.Fprintf(out, "\n%d passed, %d failed, %d skipped\n", len(passed), len(failed), len(skipped))
	if len(failed) > 0 || len(failedPkgs) > 0 {
		return 1
	}
	return 0
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
