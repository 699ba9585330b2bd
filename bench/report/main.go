// Command report writes docs/bench/REPORT.md and its SVG plots from the
// results of the benchmarks: the JSON of bench/cowfs (--save) and, when
// given, the text and Markdown outputs of the other benchmarks, which it
// includes as they are. It measures nothing itself and invents nothing: a
// figure whose data is missing says so.
//
//	go run ./bench/report --cowfs cowfs.json [--sandbox sandbox.json] [--vmm vmm.json] [--text NAME=FILE ...] [--out docs/bench]
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	os.Exit(mainErr(os.Args[1:], os.Stderr))
}

// textFlag collects --text NAME=FILE pairs in order.
type textFlag []textFile

type textFile struct{ name, path string }

func (t *textFlag) String() string { return "" }

func (t *textFlag) Set(s string) error {
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("want NAME=FILE, got %q", s)
	}
	*t = append(*t, textFile{name, path})
	return nil
}

func mainErr(args []string, stderr io.Writer) int {
	fl := flag.NewFlagSet("report", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var cowfsJSON listFlag
	fl.Var(&cowfsJSON, "cowfs", "JSON results of bench/cowfs (its --save file); repeatable, the runs' sections are shown in order")
	out := fl.String("out", "docs/bench", "directory for REPORT.md and the plots")
	sandboxJSON := fl.String("sandbox", "", "JSON results of bench/sandbox (its --save file): the goals it measures")
	vmJSON := fl.String("vmm", "", "JSON results of bench/vmm (its --save file): the VM fork figures")
	check := fl.Bool("check", false, "fail unless every row of every section has a positive number for every tool that ran it")
	var texts textFlag
	fl.Var(&texts, "text", "NAME=FILE: include FILE (a benchmark's output) under the heading NAME; repeatable")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if len(cowfsJSON) == 0 {
		fmt.Fprintln(stderr, "report: --cowfs FILE is required (run go run ./bench/cowfs --save FILE first)")
		return 2
	}
	rep, err := readRuns(cowfsJSON)
	if err == nil && *sandboxJSON != "" {
		err = rep.addSandbox(*sandboxJSON)
	}
	if err == nil && *vmJSON != "" {
		err = rep.addVM(*vmJSON)
	}
	if err != nil {
		fmt.Fprintln(stderr, "report:", err)
		return 1
	}
	if err := write(rep, texts, *out); err != nil {
		fmt.Fprintln(stderr, "report:", err)
		return 1
	}
	if *check {
		if errs := checkNumbers(rep); len(errs) > 0 {
			for _, e := range errs {
				fmt.Fprintln(stderr, "report: check:", e)
			}
			return 1
		}
	}
	return 0
}

// listFlag collects a repeated flag's values.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// readRuns reads and merges the results of several runs: sections in
// order, tools in first-seen order, the machine of the first run.
func readRuns(paths []string) (*report, error) {
	var all *report
	for _, p := range paths {
		rep, err := readCowfs(p)
		if err != nil {
			return nil, err
		}
		rep.Runs = []run{{Command: rep.Command, Started: rep.Started, Seconds: rep.Seconds, LoadStart: rep.Machine.LoadStart, LoadEnd: rep.Machine.LoadEnd}}
		if all == nil {
			all = rep
			continue
		}
		all.Runs = append(all.Runs, rep.Runs...)
		all.Sections = append(all.Sections, rep.Sections...)
		for _, t := range rep.Tools {
			if !slices.Contains(all.Tools, t) {
				all.Tools = append(all.Tools, t)
			}
		}
		if rep.Mode != all.Mode {
			all.Mode += "+" + rep.Mode
		}
	}
	return all, nil
}

func readCowfs(path string) (*report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the cowfs results: %w", err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("decode the cowfs results %s: %w", path, err)
	}
	return &rep, nil
}

// write renders REPORT.md and the plots into dir.
func write(rep *report, texts textFlag, dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "plots"), 0o755); err != nil {
		return err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Benchmark report\n\n")
	fmt.Fprintf(&b, "Written by `make bench` (`go run ./bench/report`) from the results of the benchmark runs listed below. ")
	fmt.Fprintf(&b, "Every number was measured in those runs, each peer in the same run as the tine numbers it is compared with; a figure whose data this machine cannot produce says so instead.\n\n")
	for _, r := range rep.Runs {
		fmt.Fprintf(&b, "- run: `%s`, started %s, took %s, load average (1/5/15 min) %s at the start and %s at the end\n",
			r.Command, r.Started.UTC().Format(time.RFC3339), (time.Duration(r.Seconds) * time.Second).String(), r.LoadStart, r.LoadEnd)
	}
	if c := gitCommit(); c != "" {
		fmt.Fprintf(&b, "- commit: %s\n", c)
	}
	writeMachine(&b, rep)
	plots, err := drawPlots(rep, filepath.Join(dir, "plots"))
	if err != nil {
		return err
	}
	writeGoals(&b, rep)
	writeLevers(&b, rep)
	writePlots(&b, plots)
	writeTables(&b, rep)
	for _, t := range texts {
		body, err := os.ReadFile(t.path)
		if err != nil {
			return fmt.Errorf("include %s: %w", t.name, err)
		}
		fmt.Fprintf(&b, "\n## %s\n\n", t.name)
		if strings.HasSuffix(t.path, ".md") {
			b.Write(body)
		} else {
			fmt.Fprintf(&b, "```\n%s\n```\n", strings.TrimRight(string(body), "\n"))
		}
	}
	writeMethod(&b, rep)
	return os.WriteFile(filepath.Join(dir, "REPORT.md"), b.Bytes(), 0o644)
}

// checkNumbers lists every result that is missing, failed or not positive.
func checkNumbers(rep *report) []string {
	var errs []string
	if len(rep.Sections) == 0 {
		errs = append(errs, "no sections in the results")
	}
	for _, s := range rep.Sections {
		if len(s.Rows) == 0 {
			errs = append(errs, s.Title+": no rows")
		}
		for _, r := range s.Rows {
			if len(r.Results) == 0 {
				errs = append(errs, s.Title+" / "+r.Name+": no results")
			}
			for tool, res := range r.Results {
				switch {
				case res.Err != "":
					errs = append(errs, fmt.Sprintf("%s / %s / %s: %s", s.Title, r.Name, tool, oneLine(res.Err)))
				case len(res.Samples) == 0 || !(res.Median > 0):
					errs = append(errs, fmt.Sprintf("%s / %s / %s: no positive number", s.Title, r.Name, tool))
				}
			}
		}
	}
	return errs
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
