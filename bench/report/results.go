package main

import (
	"fmt"
	"math"
	"time"

	"tine/bench/internal/sandboxrun"
	"tine/bench/internal/vmrun"
)

// The results as bench/cowfs writes them (its --save JSON); only the
// fields the report reads.
type report struct {
	Command  string          `json:"command"`
	Mode     string          `json:"mode"`
	Started  time.Time       `json:"started"`
	Seconds  float64         `json:"seconds"`
	Machine  machine         `json:"machine"`
	Tools    []string        `json:"tools"`
	Sections []*section      `json:"sections"`
	Runs     []run           `json:"-"` // the runs merged into this report
	Sandbox  *sandboxrun.Run `json:"-"` // bench/sandbox's results, when given
	VM       *vmrun.Run      `json:"-"` // bench/vmm's results, when given
}

// run is one benchmark run merged into the report.
type run struct {
	Command            string
	Started            time.Time
	Seconds            float64
	LoadStart, LoadEnd string
}

type machine struct {
	CPUs      int    `json:"nproc"`
	CPU       string `json:"cpu"`
	Kernel    string `json:"kernel"`
	MemGiB    int    `json:"mem_gib"`
	Go        string `json:"go"`
	WorkFS    string `json:"work_fs"`
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

type section struct {
	Title string `json:"title"`
	Note  string `json:"note"`
	Rows  []*row `json:"rows"`
}

type row struct {
	Name    string             `json:"name"`
	Unit    string             `json:"unit"`
	Cache   string             `json:"cache"`
	Results map[string]*result `json:"results"`
	Goal    *goal              `json:"goal"`
	GoalMet *bool              `json:"goal_met"`
}

type goal struct {
	Text     string  `json:"text"`
	Max      float64 `json:"max_seconds"`
	Peer     string  `json:"peer"`
	MaxRatio float64 `json:"max_ratio"`
	MinRatio float64 `json:"min_ratio"`
	Faster   string  `json:"faster_than"`
}

type result struct {
	Median    float64   `json:"median"`
	Min       float64   `json:"min"`
	Max       float64   `json:"max"`
	P99       float64   `json:"p99"`
	Samples   []float64 `json:"samples"`
	Quantiles []float64 `json:"quantiles"`
	Note      string    `json:"note"`
	Err       string    `json:"error"`
}

func (r *result) ok() bool { return r != nil && r.Err == "" && len(r.Samples) > 0 }

// rate reports whether the row's values are bytes per second.
func (rw *row) rate() bool { return rw.Unit == "B/s" }

// ratio is tine's median over peer's, or NaN when either is missing.
func (rw *row) ratio(peer string) float64 {
	t, p := rw.Results["tine"], rw.Results[peer]
	if !t.ok() || !p.ok() || p.Median == 0 {
		return math.NaN()
	}
	return t.Median / p.Median
}

// sectionByPrefix returns the first section whose title starts with p.
func (rep *report) sectionByPrefix(p string) *section {
	for _, s := range rep.Sections {
		if len(s.Title) >= len(p) && s.Title[:len(p)] == p {
			return s
		}
	}
	return nil
}

// rowByPrefix returns the first row of s whose name starts with p.
func (s *section) rowByPrefix(p string) *row {
	if s == nil {
		return nil
	}
	for _, r := range s.Rows {
		if len(r.Name) >= len(p) && r.Name[:len(p)] == p {
			return r
		}
	}
	return nil
}

func formatValue(rate bool, v float64) string {
	if rate {
		return fmt.Sprintf("%.0f MB/s", v/1e6)
	}
	switch {
	case v < 1e-3:
		return fmt.Sprintf("%.0f µs", v*1e6)
	case v < 1:
		return fmt.Sprintf("%.2f ms", v*1e3)
	default:
		return fmt.Sprintf("%.2f s", v)
	}
}

func formatRatio(x float64) string {
	switch {
	case math.IsNaN(x):
		return "-"
	case x >= 10:
		return fmt.Sprintf("%.1fx", x)
	default:
		return fmt.Sprintf("%.2fx", x)
	}
}
