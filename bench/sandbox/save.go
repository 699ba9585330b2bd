package main

import (
	"encoding/json"
	"os"
	"strings"
	"time"
)

// savedRun is the JSON form of a run that bench/report reads (--sandbox).
type savedRun struct {
	Command   string     `json:"command"`
	Started   time.Time  `json:"started"`
	Seconds   float64    `json:"seconds"`
	Host      string     `json:"host"`
	LoadStart string     `json:"load_start"`
	LoadEnd   string     `json:"load_end"`
	Rows      []savedRow `json:"rows"`
	Goals     []string   `json:"goals"`
}

// savedRow is one row: its samples in seconds, in the order taken.
type savedRow struct {
	Section string    `json:"section"`
	Tool    string    `json:"tool"`
	What    string    `json:"what"`
	Samples []float64 `json:"samples"`
	Note    string    `json:"note,omitempty"`
}

// saveJSON writes the run to path.
func (r *report) saveJSON(path string) error {
	out := savedRun{Command: r.command, Started: r.date, Seconds: time.Since(r.date).Seconds(), Host: r.host,
		LoadStart: r.loadStart, LoadEnd: r.loadEnd, Goals: r.goals}
	for _, x := range r.rows {
		sr := savedRow{Section: x.section, Tool: x.tool, What: x.what, Note: x.note}
		for _, d := range x.samples {
			sr.Samples = append(sr.Samples, d.Seconds())
		}
		out.Rows = append(out.Rows, sr)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// loadavg returns the first three fields of /proc/loadavg, or "" where it
// cannot be read.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
