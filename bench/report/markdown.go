package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strings"
)

func writeMachine(b *bytes.Buffer, rep *report) {
	m := rep.Machine
	fmt.Fprintf(b, "\n## Machine\n\n")
	fmt.Fprintf(b, "| | |\n|---|---|\n")
	fmt.Fprintf(b, "| CPU | %s |\n| cores (nproc) | %d |\n| memory | %d GiB |\n| kernel | %s |\n", m.CPU, m.CPUs, m.MemGiB, m.Kernel)
	fmt.Fprintf(b, "| KVM | %s |\n", kvmFlavour())
	fmt.Fprintf(b, "| filesystem of the work directory | %s |\n| Go | %s |\n", m.WorkFS, m.Go)
	for i, r := range rep.Runs {
		fmt.Fprintf(b, "| load average (1/5/15 min), run %d | %s at the start, %s at the end |\n", i+1, r.LoadStart, r.LoadEnd)
	}
	fmt.Fprintf(b, "\nThe machine is shared with other work, so absolute numbers move with its load; every peer runs in the same run, interleaved with tine, and the tables give ratios.\n")
}

// kvmFlavour describes the virtualization the VM benchmarks would use.
func kvmFlavour() string {
	var parts []string
	if _, err := os.Stat("/dev/kvm"); err != nil {
		parts = append(parts, "no /dev/kvm (the VM benchmarks cannot run here)")
	} else {
		kind := "hardware"
		for mod, name := range map[string]string{"kvm_pvm": "PVM (software, paravirtualized)", "kvm_intel": "hardware (VMX)", "kvm_amd": "hardware (SVM)"} {
			if _, err := os.Stat("/sys/module/" + mod); err == nil {
				kind = name
			}
		}
		parts = append(parts, "/dev/kvm: "+kind)
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil && strings.Contains(string(b), " hypervisor") {
		parts = append(parts, "this machine is itself a guest (cpuinfo flag hypervisor)")
	}
	return strings.Join(parts, "; ")
}

// goalLine is one line of the goals table.
type goalLine struct {
	workload, goal, measured string
	met                      *bool
}

func writeGoals(b *bytes.Buffer, rep *report) {
	var lines []goalLine
	agent := rep.sectionByPrefix("Agent workloads")
	if agent != nil {
		for _, r := range agent.Rows {
			if r.Goal == nil {
				continue
			}
			x := r.ratio(r.Goal.Peer)
			meas := formatRatio(x) + " " + r.Goal.Peer
			if r.Goal.Faster != "" {
				meas += fmt.Sprintf("; %s vs %s", formatRatio(r.ratio(r.Goal.Faster)), r.Goal.Faster)
			}
			if t := r.Results["tine"]; t.ok() && len(t.Samples) > 1 {
				meas += fmt.Sprintf(" (tine's samples %s–%s)", formatValue(r.rate(), t.Min), formatValue(r.rate(), t.Max))
			}
			lines = append(lines, goalLine{r.Name, r.Goal.Text, meas, r.GoalMet})
		}
	} else {
		lines = append(lines, goalLine{"agent workloads", "<= 1.5x ext4", "not run (bench/cowfs --only agent)", nil})
	}
	snap := rep.sectionByPrefix("Snapshot and fork")
	if r := snap.rowByPrefix("snapshot, synth 100k"); r != nil && r.Results["tine"].ok() {
		lines = append(lines, goalLine{"snapshot of a live tree, 100k files", "<= 1 ms", formatValue(false, r.Results["tine"].Median), r.GoalMet})
	} else {
		lines = append(lines, goalLine{"snapshot of a live tree, 100k files", "<= 1 ms", "not measured in this run (needs the full mode's 100k tree)", nil})
	}
	if r := snap.rowByPrefix("fork, synth 100k"); r != nil && r.Results["tine pool"].ok() {
		v := r.Results["tine pool"].Median
		met := v <= 1e-3
		lines = append(lines, goalLine{"fork (filesystem part: pooled mount), 100k files", "<= 1 ms", formatValue(false, v), &met})
	}
	if v, r, ok := rep.Sandbox.Median("fork x1", "tine"); ok {
		met := v <= 1e-3
		lines = append(lines, goalLine{"fork through the API", "<= 1 ms",
			fmt.Sprintf("%s (bench/sandbox, median of %d: %s)", formatValue(false, v), len(r.Samples), r.What), &met})
	} else {
		lines = append(lines, goalLine{"fork through the API", "<= 1 ms", "not measured in these runs (bench/sandbox --save FILE, then --sandbox FILE)", nil})
	}
	diff := rep.sectionByPrefix("Diff latency")
	if r := diff.rowByPrefix("diff, 100 changed of 100k"); r != nil && r.Results["tine"].ok() {
		lines = append(lines, goalLine{"diff of 100 changes at 100k files", "<= 10 ms", formatValue(false, r.Results["tine"].Median), r.GoalMet})
	} else {
		lines = append(lines, goalLine{"diff of 100 changes at 100k files", "<= 10 ms", "not measured in this run (needs the full mode's 100k tree)", nil})
	}
	fmt.Fprintf(b, "\n## Goals\n\nRatios are tine's median over the peer's median in the same run (for times lower is better, for MB/s higher).\n\n")
	fmt.Fprintf(b, "| workload | goal | measured | met |\n|---|---|---|---|\n")
	for _, l := range lines {
		met := "-"
		if l.met != nil {
			met = map[bool]string{true: "yes", false: "**no**"}[*l.met]
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", l.workload, l.goal, l.measured, met)
	}
}

// leverTool is the agent column that runs tine without the lever of
// ADR 0181 (FUSE over io_uring), in the same run.
const leverTool = "tine, /dev/fuse"

// writeLevers shows, for each agent row, tine beside the same tine
// served over /dev/fuse instead of io_uring, measured in the same run.
func writeLevers(b *bytes.Buffer, rep *report) {
	agent := rep.sectionByPrefix("Agent workloads")
	if agent == nil || agent.Rows[0].Results[leverTool] == nil {
		return
	}
	fmt.Fprintf(b, "\n## Lever measured in this run: FUSE over io_uring (ADR 0181)\n\n")
	fmt.Fprintf(b, "The agent loop ran on tine twice, interleaved with the peers: as it is now (requests on per-CPU io_uring queues), "+
		"and served over /dev/fuse as before ADR 0181. The kernel caches kept long (ADR 0160) were measured the same way in the report "+
		"of 2026-11-23; other levers (ADR 0161, 0163) with `bench/fsprof`, their numbers in the ADRs.\n\n")
	fmt.Fprintf(b, "Last column: tine's median over the old one's (for times below 1 is faster, for MB/s above 1).\n\n")
	fmt.Fprintf(b, "| workload | %s | tine | tine / before |\n|---|---|---|---|\n", leverTool)
	for _, r := range agent.Rows {
		t, o := r.Results["tine"], r.Results[leverTool]
		if !t.ok() || !o.ok() {
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", r.Name, formatValue(r.rate(), o.Median), formatValue(r.rate(), t.Median), formatRatio(t.Median/o.Median))
	}
}

func writePlots(b *bytes.Buffer, plots []plotRef) {
	fmt.Fprintf(b, "\n## Plots\n\n")
	for _, p := range plots {
		if p.file == "" {
			fmt.Fprintf(b, "- **%s**: %s\n", p.title, p.missing)
			continue
		}
		fmt.Fprintf(b, "### %s\n\n![%s](plots/%s)\n\n", p.title, p.title, p.file)
	}
}

func writeTables(b *bytes.Buffer, rep *report) {
	fmt.Fprintf(b, "\n## Tables\n\nCells: median [tine/peer], then min–max and p99 (nearest rank over the samples; with few samples it is the largest).\n")
	for _, s := range rep.Sections {
		var tools []string
		for _, t := range rep.Tools {
			for _, r := range s.Rows {
				if _, ok := r.Results[t]; ok {
					tools = append(tools, t)
					break
				}
			}
		}
		if len(tools) == 0 {
			continue
		}
		fmt.Fprintf(b, "\n### %s\n\n%s\n\n", s.Title, s.Note)
		fmt.Fprintf(b, "| row | cache | %s | goal | met |\n|---|---|%s---|---|\n", strings.Join(tools, " | "), strings.Repeat("---|", len(tools)))
		var fails []string
		for _, r := range s.Rows {
			fmt.Fprintf(b, "| %s | %s |", r.Name, r.Cache)
			for _, t := range tools {
				res := r.Results[t]
				switch {
				case res == nil:
					b.WriteString(" - |")
				case !res.ok():
					b.WriteString(" failed |")
					fails = append(fails, fmt.Sprintf("%s / %s: %s", r.Name, t, oneLine(res.Err)))
				default:
					cell := formatValue(r.rate(), res.Median)
					if x := r.ratio(t); t != "tine" && t != "tine pool" && !math.IsNaN(x) {
						cell += " [" + formatRatio(x) + "]"
					}
					cell += fmt.Sprintf("<br>%s–%s, p99 %s", formatValue(r.rate(), res.Min), formatValue(r.rate(), res.Max), formatValue(r.rate(), res.P99))
					fmt.Fprintf(b, " %s |", cell)
				}
			}
			g, met := "", ""
			if r.Goal != nil {
				g, met = r.Goal.Text, "?"
				if r.GoalMet != nil {
					met = map[bool]string{true: "yes", false: "**no**"}[*r.GoalMet]
				}
			}
			fmt.Fprintf(b, " %s | %s |\n", g, met)
		}
		for _, f := range fails {
			fmt.Fprintf(b, "\n- failed: %s", f)
		}
		if len(fails) > 0 {
			b.WriteString("\n")
		}
	}
}

func oneLine(s string) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " | ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func writeMethod(b *bytes.Buffer, rep *report) {
	fmt.Fprintf(b, `
## Methodology

- **One run, peers side by side.** Every peer runs in the same run as tine, on the same data. In the agent
  section the filesystems are interleaved: each repetition runs the whole agent loop once on every
  filesystem, in an order that rotates between repetitions, so that load from elsewhere on the machine
  falls on all of them alike. Ratios (tine/peer) are the figures to read; absolute times move with the load.
- **Native floor.** ext4 on a fresh loop image (sparse file on the work directory's disk), made with no
  lazy initialisation so that no background zeroing runs during the measurements.
- **Warm-up.** The project tarball, the Go build cache and the module cache of the local proxy are made
  before any timing; the first go build of each repetition (untimed) lets the cache learn the tree; "warm"
  rows run with the kernel's caches as the previous step left them, "cold" rows after
  `+"`echo 3 > /proc/sys/vm/drop_caches`"+`, "first read" after a fresh mount and a cache drop.
- **Statistics.** Medians over the repetitions (mode %q of bench/cowfs), min–max and p99 (nearest rank).
  The lstat latency CDF is built from every lstat of every repetition (percentiles 0–100).
- **Nothing from the network.** The package install is `+"`go mod download`"+` of this module's own
  dependency graph from a `+"`file://`"+` GOPROXY (the host's module download cache), into a GOMODCACHE on the
  filesystem under test.
- **Reproduce.** `+"`make bench`"+` (full) or `+"`tine bench fs|snapshot --json`"+` for one figure; `+"`make bench-quick`"+`
  checks that every benchmark runs and produces numbers (not that they are fast).
`, rep.Mode)
}

func kvmOK() bool {
	_, err := os.Stat("/dev/kvm")
	return err == nil
}
