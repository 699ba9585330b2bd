package fsbench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"tine/bench/internal/peer"
)

// TestTinyRun runs every section in tiny mode on the real peers and checks
// that each tool produced a result for each row, that the report encodes,
// and that nothing (mount, loop device, directory) is left behind. It
// asserts nothing about speed.
func TestTinyRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, loop devices and drop_caches")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("needs /dev/fuse: %v", err)
	}
	if err := peer.Require("mkfs.btrfs", "btrfs", "losetup", "fuse-overlayfs", "git", "tar", "cp", "go"); err != nil {
		t.Skipf("peer programs missing: %v", err)
	}
	cfg, err := modeConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dir = t.TempDir()
	cfg.Sections, _ = parseSet("", []string{secSnapFork, secDiff, secIO, secAgent})
	cfg.Tools, _ = parseSet("", allTools)
	var log bytes.Buffer
	cfg.Log = &log
	rep, err := run(context.Background(), cfg, "test")
	if err != nil {
		t.Fatalf("run: %v\nlog:\n%s", err, log.String())
	}
	wantTools := map[string][]string{
		"Snapshot and fork latency": {toolTine, toolTinePool, toolBtrfs, toolOverlay, toolCp, toolGit},
		"Diff latency":              {toolTine, toolBtrfs, toolGit},
		"Data and metadata":         {toolTine, toolNative, toolOverlay, toolFuseOverlay},
		"Agent workloads":           {toolTine, toolTineDevFUSE, toolExt4, toolBtrfs, toolOverlay, toolFuseOverlay},
	}
	if len(rep.Sections) != 4 {
		t.Fatalf("got %d sections, want 4", len(rep.Sections))
	}
	for _, s := range rep.Sections {
		var tools []string
		for prefix, ts := range wantTools {
			if strings.HasPrefix(s.Title, prefix) {
				tools = ts
			}
		}
		if tools == nil {
			t.Fatalf("unexpected section %q", s.Title)
		}
		if len(s.Rows) == 0 {
			t.Errorf("section %q has no rows", s.Title)
		}
		for _, r := range s.Rows {
			for _, tool := range tools {
				if tool == toolTinePool && strings.HasPrefix(r.Name, "snapshot") {
					continue // the pool changes forks only
				}
				res := r.Results[tool]
				switch {
				case res == nil:
					t.Errorf("%s / %s: no result", r.Name, tool)
				case res.Err != "":
					t.Errorf("%s / %s: %s", r.Name, tool, res.Err)
				case len(res.Samples) == 0 || res.Median <= 0:
					t.Errorf("%s / %s: no positive samples: %v", r.Name, tool, res.Samples)
				}
			}
			if r.Goal != nil && r.GoalMet == nil {
				t.Errorf("%s: goal %q not evaluated", r.Name, r.Goal.Text)
			}
		}
	}

	var js bytes.Buffer
	if err := writeJSON(&js, rep); err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("report JSON does not decode: %v", err)
	}
	if len(back.Sections) != len(rep.Sections) || back.Machine.CPUs == 0 {
		t.Errorf("report JSON lost data: %d sections, %d CPUs", len(back.Sections), back.Machine.CPUs)
	}
	var csv bytes.Buffer
	if err := writeCSV(&csv, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(csv.String(), "section,row,unit,cache,tool,") || strings.Count(csv.String(), "\n") < 10 {
		t.Errorf("CSV report:\n%s", csv.String())
	}
	var tab bytes.Buffer
	if err := writeTable(&tab, rep); err != nil {
		t.Fatal(err)
	}
	for _, tool := range allTools {
		if !strings.Contains(tab.String(), tool) {
			t.Errorf("table does not mention %s", tool)
		}
	}

	// Nothing may be left behind.
	work := rep.Machine.WorkDir
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("work dir %s still exists (%v)", work, err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), work) {
		t.Errorf("mounts left under %s:\n%s", work, mi)
	}
	loops, err := peer.Run(context.Background(), "", "losetup", "-a")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(loops), work) {
		t.Errorf("loop device left attached to an image under %s:\n%s", work, loops)
	}
}

func TestCleanupAfterCancel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, loop devices and drop_caches")
	}
	if err := peer.Require("mkfs.btrfs", "btrfs", "losetup", "git", "cp"); err != nil {
		t.Skipf("peer programs missing: %v", err)
	}
	cfg, err := modeConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dir = t.TempDir()
	cfg.Sections, _ = parseSet(secSnapFork, []string{secSnapFork, secDiff, secIO})
	cfg.Tools, _ = parseSet("", allTools)
	ctx, cancel := context.WithCancel(context.Background())
	var log cancelAfter
	log.n, log.cancel = 3, cancel // cancel in the middle of the section
	cfg.Log = &log
	_, err = run(ctx, cfg, "test")
	if err == nil {
		t.Fatal("run after cancel returned no error")
	}
	ents, rerr := os.ReadDir(cfg.Dir)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if len(ents) != 0 {
		t.Errorf("%d entries left in %s after cancel", len(ents), cfg.Dir)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), cfg.Dir) {
		t.Errorf("mounts left under %s after cancel", cfg.Dir)
	}
}

// cancelAfter is a log writer that cancels a context at the n-th line.
type cancelAfter struct {
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	c.n--
	if c.n == 0 {
		c.cancel()
	}
	return len(p), nil
}

func TestParseSet(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"", 3, false},
		{"diff", 1, false},
		{"diff, io", 2, false},
		{"nope", 0, true},
	}
	for _, tc := range tests {
		got, err := parseSet(tc.in, []string{secSnapFork, secDiff, secIO})
		if (err != nil) != tc.wantErr || len(got) != tc.want {
			t.Errorf("parseSet(%q) = %v, %v; want %d names, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		in               []float64
		median, min, max float64
	}{
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
		{[]float64{5}, 5, 5, 5},
	}
	for _, tc := range tests {
		r := summarize(tc.in)
		if r.Median != tc.median || r.Min != tc.min || r.Max != tc.max {
			t.Errorf("summarize(%v) = %v/%v/%v, want %v/%v/%v", tc.in, r.Median, r.Min, r.Max, tc.median, tc.min, tc.max)
		}
	}
}

// TestSmallModule checks the tiny mode's cut of this module's go.mod and
// go.sum: one requirement and only its checksums.
func TestSmallModule(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile("../../go.sum")
	if err != nil {
		t.Fatal(err)
	}
	m, s := string(smallModule("go.mod", mod)), string(smallModule("go.sum", sum))
	if !strings.HasPrefix(m, "module tine\n") || strings.Count(m, "require ") != 1 || !strings.Contains(m, "require github.com/google/go-cmp v") {
		t.Errorf("go.mod cut:\n%s", m)
	}
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if !strings.HasPrefix(l, "github.com/google/go-cmp ") {
			t.Errorf("go.sum cut has %q", l)
		}
	}
	if s == "\n" {
		t.Error("go.sum cut is empty")
	}
}
