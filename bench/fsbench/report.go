package fsbench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// unit says how a row's values read. Latencies are seconds (lower is
// better); throughputs are bytes per second (higher is better).
type unit string

const (
	unitSeconds unit = "s"
	unitBytesPS unit = "B/s"
)

// result is one tool's measurements of one row.
type result struct {
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	P99     float64   `json:"p99"` // nearest rank; with few samples, the largest
	Samples []float64 `json:"samples"`
	// Quantiles, when set, are the 0th, 1st, ..., 100th percentiles of the
	// per-operation latencies inside the samples (for latency CDFs).
	Quantiles []float64 `json:"quantiles,omitempty"`
	Note      string    `json:"note,omitempty"`
	Err       string    `json:"error,omitempty"`
}

// row is one measured quantity across tools, e.g. "snapshot, synth 100k".
type row struct {
	Name    string             `json:"name"`
	Unit    unit               `json:"unit"`
	Cache   string             `json:"cache"` // "warm" or "cold"
	Results map[string]*result `json:"results"`
	Goal    *goal              `json:"goal,omitempty"`
	GoalMet *bool              `json:"goal_met,omitempty"`
}

// goal is a target for tine's value: an absolute bound (Max seconds) or a
// bound on the ratio to a peer (tine/Peer <= MaxRatio or >= MinRatio).
type goal struct {
	Text     string  `json:"text"`
	Max      float64 `json:"max_seconds,omitempty"`
	Peer     string  `json:"peer,omitempty"`
	MaxRatio float64 `json:"max_ratio,omitempty"`
	MinRatio float64 `json:"min_ratio,omitempty"`
	Faster   string  `json:"faster_than,omitempty"` // and tine must beat this peer
}

// section is one table of the report.
type section struct {
	Title string `json:"title"`
	Note  string `json:"note"`
	Rows  []*row `json:"rows"`
}

// machine describes where the benchmark ran.
type machine struct {
	CPUs    int    `json:"nproc"`
	CPU     string `json:"cpu"`
	Kernel  string `json:"kernel"`
	MemGiB  int    `json:"mem_gib"`
	Go      string `json:"go"`
	WorkDir string `json:"work_dir"`
	WorkFS  string `json:"work_fs"`
	// Load is /proc/loadavg at the start and at the end of the run: other
	// work on the machine makes the numbers noisier.
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

// report is the whole output of one run.
type report struct {
	Command  string     `json:"command"`
	Mode     string     `json:"mode"`
	Started  time.Time  `json:"started"`
	Seconds  float64    `json:"seconds"`
	Machine  machine    `json:"machine"`
	Tools    []string   `json:"tools"`
	Sections []*section `json:"sections"`
}

// summarize fills median, min and max from samples.
func summarize(samples []float64) *result {
	r := &result{Samples: samples}
	if len(samples) == 0 {
		return r
	}
	s := append([]float64(nil), samples...)
	sort.Float64s(s)
	r.Min, r.Max = s[0], s[len(s)-1]
	r.P99 = s[min(len(s)-1, int(math.Ceil(0.99*float64(len(s))))-1)]
	if len(s)%2 == 1 {
		r.Median = s[len(s)/2]
	} else {
		r.Median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return r
}

// ok reports whether r holds a usable value.
func (r *result) ok() bool { return r != nil && r.Err == "" && len(r.Samples) > 0 }

// evaluate sets GoalMet from tine's result and the peers'.
func (rw *row) evaluate() {
	g, t := rw.Goal, rw.Results[toolTine]
	if g == nil || !t.ok() {
		return
	}
	met := true
	if g.Max > 0 {
		met = met && t.Median <= g.Max
	}
	if g.Peer != "" {
		p := rw.Results[g.Peer]
		if !p.ok() || p.Median == 0 {
			return
		}
		ratio := t.Median / p.Median
		if g.MaxRatio > 0 {
			met = met && ratio <= g.MaxRatio
		}
		if g.MinRatio > 0 {
			met = met && ratio >= g.MinRatio
		}
	}
	if g.Faster != "" {
		p := rw.Results[g.Faster]
		if !p.ok() {
			return
		}
		if rw.Unit == unitBytesPS {
			met = met && t.Median > p.Median
		} else {
			met = met && t.Median < p.Median
		}
	}
	rw.GoalMet = &met
}

// formatValue prints v in the row's unit at a readable scale.
func formatValue(u unit, v float64) string {
	switch u {
	case unitBytesPS:
		return fmt.Sprintf("%.0f MB/s", v/1e6)
	default:
		switch {
		case v < 1e-3:
			return fmt.Sprintf("%.0f µs", v*1e6)
		case v < 1:
			return fmt.Sprintf("%.2f ms", v*1e3)
		default:
			return fmt.Sprintf("%.2f s", v)
		}
	}
}

func formatRatio(x float64) string {
	switch {
	case x >= 100 || x == 0:
		return fmt.Sprintf("%.0fx", x)
	case x >= 10:
		return fmt.Sprintf("%.1fx", x)
	case x >= 0.01:
		return fmt.Sprintf("%.2fx", x)
	default:
		return fmt.Sprintf("%.1gx", x)
	}
}

// writeTable prints the report as plain-text tables: per row, each tool's
// median and, for peers, the ratio tine/peer.
func writeTable(w io.Writer, rep *report) error {
	fmt.Fprintf(w, "tine cowfs benchmark (%s mode)\n", rep.Mode)
	m := rep.Machine
	fmt.Fprintf(w, "machine: %d CPUs, %s, kernel %s, %d GiB RAM, %s; work dir %s (%s)\n",
		m.CPUs, m.CPU, m.Kernel, m.MemGiB, m.Go, m.WorkDir, m.WorkFS)
	fmt.Fprintf(w, "load average (1/5/15 min) at start %s, at end %s\n", m.LoadStart, m.LoadEnd)
	fmt.Fprintf(w, "command: %s; took %s\n", rep.Command, time.Duration(rep.Seconds*float64(time.Second)).Round(time.Second))
	fmt.Fprintln(w, "cells: median [ratio tine/peer]; for times a ratio below 1 means tine is faster, for MB/s above 1.")
	fmt.Fprintln(w, "goals are checked on the tine column.")
	for _, s := range rep.Sections {
		if len(s.Rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n== %s ==\n", s.Title)
		if s.Note != "" {
			fmt.Fprintln(w, wrap(s.Note, 100))
		}
		var tools []string
		for _, t := range rep.Tools {
			for _, r := range s.Rows {
				if _, ok := r.Results[t]; ok {
					tools = append(tools, t)
					break
				}
			}
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprint(tw, "row\tcache")
		for _, t := range tools {
			fmt.Fprintf(tw, "\t%s", t)
		}
		fmt.Fprint(tw, "\tgoal\tmet\n")
		var errs []string
		for _, r := range s.Rows {
			fmt.Fprintf(tw, "%s\t%s", r.Name, r.Cache)
			tr := r.Results[toolTine]
			for _, t := range tools {
				res, ok := r.Results[t]
				switch {
				case !ok:
					fmt.Fprint(tw, "\t-")
				case !res.ok() && len(res.Samples) > 0:
					fmt.Fprintf(tw, "\t%s, then failed", formatValue(r.Unit, res.Median))
					errs = append(errs, fmt.Sprintf("%s / %s: after %d samples: %s", r.Name, t, len(res.Samples), res.Err))
				case !res.ok():
					fmt.Fprint(tw, "\tfailed")
					errs = append(errs, fmt.Sprintf("%s / %s: %s", r.Name, t, res.Err))
				case t != toolTine && t != toolTinePool && tr.ok() && res.Median > 0:
					fmt.Fprintf(tw, "\t%s [%s]", formatValue(r.Unit, res.Median), formatRatio(tr.Median/res.Median))
				default:
					fmt.Fprintf(tw, "\t%s", formatValue(r.Unit, res.Median))
				}
			}
			g, met := "", ""
			if r.Goal != nil {
				g = r.Goal.Text
				met = "?"
				if r.GoalMet != nil {
					met = map[bool]string{true: "yes", false: "NO"}[*r.GoalMet]
				}
			}
			fmt.Fprintf(tw, "\t%s\t%s\n", g, met)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		for _, e := range errs {
			e = strings.ReplaceAll(strings.TrimSpace(e), "\n", " | ")
			if len(e) > 400 {
				e = e[:400] + "..."
			}
			fmt.Fprintf(w, "  failed: %s\n", e)
		}
		var notes []string
		for _, r := range s.Rows {
			for _, t := range tools {
				if res := r.Results[t]; res != nil && res.Note != "" {
					notes = append(notes, fmt.Sprintf("%s / %s: %s", r.Name, t, res.Note))
				}
			}
		}
		for _, n := range notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
	}
	return nil
}

// writeCSV prints one line per row and tool: the summary and the samples
// (separated by spaces).
func writeCSV(w io.Writer, rep *report) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"section", "row", "unit", "cache", "tool", "median", "min", "max", "p99", "samples", "error"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	for _, s := range rep.Sections {
		for _, r := range s.Rows {
			for _, t := range rep.Tools {
				res, ok := r.Results[t]
				if !ok {
					continue
				}
				var ss []string
				for _, v := range res.Samples {
					ss = append(ss, f(v))
				}
				cw.Write([]string{s.Title, r.Name, string(r.Unit), r.Cache, t, f(res.Median), f(res.Min), f(res.Max), f(res.P99),
					strings.Join(ss, " "), res.Err})
			}
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	return nil
}

func writeJSON(w io.Writer, rep *report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(sanitize(rep)); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// sanitize replaces NaN and Inf, which JSON cannot carry, with 0.
func sanitize(rep *report) *report {
	fix := func(v *float64) {
		if math.IsNaN(*v) || math.IsInf(*v, 0) {
			*v = 0
		}
	}
	for _, s := range rep.Sections {
		for _, r := range s.Rows {
			for _, res := range r.Results {
				fix(&res.Median)
				fix(&res.Min)
				fix(&res.Max)
				for i := range res.Samples {
					fix(&res.Samples[i])
				}
			}
		}
	}
	return rep
}

func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for _, w := range strings.Fields(s) {
		if n > 0 && n+1+len(w) > width {
			b.WriteByte('\n')
			n = 0
		} else if n > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}
