package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"
)

// sandboxRun is what bench/sandbox --save writes: its rows, each with its
// samples in seconds.
type sandboxRun struct {
	Command   string       `json:"command"`
	Started   time.Time    `json:"started"`
	Seconds   float64      `json:"seconds"`
	LoadStart string       `json:"load_start"`
	LoadEnd   string       `json:"load_end"`
	Rows      []sandboxRow `json:"rows"`
}

type sandboxRow struct {
	Section string    `json:"section"`
	Tool    string    `json:"tool"`
	What    string    `json:"what"`
	Samples []float64 `json:"samples"`
}

// addSandbox reads bench/sandbox's results into the report.
func (rep *report) addSandbox(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read the sandbox results: %w", err)
	}
	var sr sandboxRun
	if err := json.Unmarshal(b, &sr); err != nil {
		return fmt.Errorf("decode the sandbox results %s: %w", path, err)
	}
	rep.Sandbox = &sr
	rep.Runs = append(rep.Runs, run{Command: sr.Command, Started: sr.Started, Seconds: sr.Seconds, LoadStart: sr.LoadStart, LoadEnd: sr.LoadEnd})
	return nil
}

// median returns the median of the samples of the row of section and
// tool, and that row; ok is false when the run has no such row or it has
// no samples.
func (sr *sandboxRun) median(section, tool string) (float64, *sandboxRow, bool) {
	if sr == nil {
		return 0, nil, false
	}
	for i := range sr.Rows {
		r := &sr.Rows[i]
		if r.Section != section || r.Tool != tool || len(r.Samples) == 0 {
			continue
		}
		s := slices.Clone(r.Samples)
		slices.Sort(s)
		if n := len(s); n%2 == 0 {
			return (s[n/2-1] + s[n/2]) / 2, r, true
		}
		return s[len(s)/2], r, true
	}
	return 0, nil, false
}
