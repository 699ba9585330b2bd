package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/bench/internal/vmrun"
)

// fixture is a small results set shaped like bench/cowfs's JSON.
func fixture() *report {
	res := func(v ...float64) *result {
		r := &result{Samples: v, Median: v[len(v)/2], Min: v[0], Max: v[len(v)-1], P99: v[len(v)-1],
			Quantiles: []float64{1e-6, 2e-6, 5e-6}}
		return r
	}
	met := false
	agent := &section{Title: "Agent workloads, project of 10k files", Rows: []*row{
		{Name: "git status", Unit: "s", Cache: "warm", GoalMet: &met,
			Goal:    &goal{Text: "<= 1.5x ext4", Peer: "ext4", MaxRatio: 1.5, Faster: "fuse-overlayfs"},
			Results: map[string]*result{"tine": res(0.3, 0.4), "tine, /dev/fuse": res(0.6, 0.7), "ext4": res(0.1, 0.2), "fuse-overlayfs": res(0.5, 0.6)}},
		{Name: "stat every file", Unit: "s", Cache: "warm",
			Results: map[string]*result{"tine": res(0.2), "ext4": res(0.1)}},
		{Name: "cold read 256 MiB", Unit: "B/s", Cache: "cold",
			Results: map[string]*result{"tine": res(1e9), "ext4": res(2e9)}},
	}}
	snap := &section{Title: "Snapshot and fork latency", Rows: []*row{
		{Name: "snapshot, synth 1k files", Unit: "s", Results: map[string]*result{"tine": res(1e-3), "btrfs": res(3e-3)}},
		{Name: "snapshot, synth 100k files", Unit: "s", Results: map[string]*result{"tine": res(2e-3), "btrfs": res(9e-3)}},
	}}
	return &report{Mode: "quick", Tools: []string{"tine", "tine, /dev/fuse", "ext4", "btrfs", "fuse-overlayfs"},
		Sections: []*section{agent, snap}, Runs: []run{{Command: "go run ./bench/cowfs"}}}
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	if err := write(fixture(), nil, dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "REPORT.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Goals", "| git status | <= 1.5x ext4 | 2.00x ext4; 0.67x vs fuse-overlayfs (tine's samples 300.00 ms–400.00 ms) | **no** |",
		"## Lever measured in this run", "| git status | 700.00 ms | 400.00 ms | 0.57x |",
		"plots/agent-vs-native.svg", "plots/stat-latency-cdf.svg", "plots/snapshot-vs-size.svg",
		"**Diff latency against the number of changes**: not drawn", "## Methodology",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
	for _, p := range []string{"agent-vs-native.svg", "stat-latency-cdf.svg", "snapshot-vs-size.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, "plots", p))
		if err != nil || !strings.Contains(string(b), "<svg") {
			t.Errorf("plot %s: %v", p, err)
		}
	}
}

func TestCheckNumbers(t *testing.T) {
	rep := fixture()
	if errs := checkNumbers(rep); len(errs) != 0 {
		t.Fatalf("complete results: %v", errs)
	}
	rep.Sections[0].Rows[1].Results["ext4"] = &result{Err: "mount failed"}
	rep.Sections[1].Rows[0].Results["btrfs"] = &result{Samples: []float64{0}}
	errs := checkNumbers(rep)
	if len(errs) != 2 || !strings.Contains(errs[0], "mount failed") || !strings.Contains(errs[1], "no positive number") {
		t.Errorf("checkNumbers: %v", errs)
	}
}

// TestSandboxGoal: the fork-through-the-API goal is filled from
// bench/sandbox's saved results, and says so when they are missing.
func TestSandboxGoal(t *testing.T) {
	dir := t.TempDir()
	if err := write(fixture(), nil, dir); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "REPORT.md"))
	if want := "| fork through the API | <= 1 ms | not measured in these runs"; !strings.Contains(string(md), want) {
		t.Errorf("without sandbox results REPORT.md lacks %q", want)
	}
	saved := filepath.Join(dir, "sandbox.json")
	body := `{"command":"go run ./bench/sandbox --quick","seconds":60,"rows":[
		{"section":"fork x1","tool":"bwrap","what":"peer","samples":[0.001]},
		{"section":"fork x1","tool":"tine","what":"Fork into 1, answered","samples":[0.030,0.020,0.025]}]}`
	if err := os.WriteFile(saved, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := fixture()
	if err := rep.addSandbox(saved); err != nil {
		t.Fatal(err)
	}
	if err := write(rep, nil, dir); err != nil {
		t.Fatal(err)
	}
	md, _ = os.ReadFile(filepath.Join(dir, "REPORT.md"))
	for _, want := range []string{
		"| fork through the API | <= 1 ms | 25.00 ms (bench/sandbox, median of 3: Fork into 1, answered) | **no** |",
		"- run: `go run ./bench/sandbox --quick`",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
	if err := rep.addSandbox(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing sandbox results file was accepted")
	}
}

// TestVMPlots: given bench/vmm's results, the report draws the VM fork
// figures (against RAM, against fan-out, the CDF); without them it says
// why each is missing.
func TestVMPlots(t *testing.T) {
	files := []string{"vm-fork-vs-ram.svg", "vm-fork-vs-fanout.svg", "vm-fork-cdf.svg"}
	dir := t.TempDir()
	if err := write(fixture(), nil, dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "REPORT.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(md), "VM fork") - strings.Count(string(md), "plots/vm-"); n < 3 || strings.Contains(string(md), "plots/vm-") {
		t.Errorf("without VM results: want three figures said missing, and none drawn:\n%s", md)
	}
	rep := fixture()
	rep.VM = &vmrun.Run{KVM: "PVM", Forks: []vmrun.Fork{
		{RAM: 256 << 20, Method: "fork, MAP_PRIVATE", Samples: []float64{2e-4, 3e-4, 9e-4}},
		{RAM: 4 << 30, Method: "fork, MAP_PRIVATE", Samples: []float64{3e-4, 4e-4}},
		{RAM: 256 << 20, Method: "baseline: cold start", Baseline: true, Samples: []float64{2e-3, 3e-3}},
	}, FanOut: []vmrun.FanOut{{Children: 1, Forked: 1e-4, Answered: 2e-4}, {Children: 100, Forked: 4e-3, Answered: 1.6e-2}}}
	dir = t.TempDir()
	if err := write(rep, nil, dir); err != nil {
		t.Fatal(err)
	}
	if md, err = os.ReadFile(filepath.Join(dir, "REPORT.md")); err != nil {
		t.Fatal(err)
	}
	for _, p := range files {
		if !strings.Contains(string(md), "plots/"+p) {
			t.Errorf("REPORT.md does not show %s", p)
		}
		b, err := os.ReadFile(filepath.Join(dir, "plots", p))
		if err != nil || !strings.Contains(string(b), "<svg") || !strings.Contains(string(b), "MAP_PRIVATE") && p != "vm-fork-vs-fanout.svg" {
			t.Errorf("plot %s: %v (no SVG, or no legend for the method)", p, err)
		}
	}
}
