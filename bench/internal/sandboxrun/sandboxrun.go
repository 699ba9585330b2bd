// Package sandboxrun is the JSON form of a bench/sandbox run (its --save
// file), which bench/report reads (--sandbox).
package sandboxrun

import (
	"slices"
	"time"

	"tine/bench/internal/runfile"
)

// Run is one run of bench/sandbox.
type Run struct {
	Command   string    `json:"command"`
	Started   time.Time `json:"started"`
	Seconds   float64   `json:"seconds"`
	Host      string    `json:"host"`
	LoadStart string    `json:"load_start"` // /proc/loadavg's first three fields
	LoadEnd   string    `json:"load_end"`
	Rows      []Row     `json:"rows"`
	Goals     []string  `json:"goals"`
}

// Row is one measured line: one tool doing one thing, its samples in
// seconds in the order taken.
type Row struct {
	Section string    `json:"section"`
	Tool    string    `json:"tool"`
	What    string    `json:"what"`
	Samples []float64 `json:"samples"`
	Note    string    `json:"note,omitempty"`
}

// Save writes r to path.
func (r *Run) Save(path string) error { return runfile.Save(path, r) }

// Load reads a run saved at path.
func Load(path string) (*Run, error) {
	var r Run
	if err := runfile.Load(path, "the sandbox results", &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Median returns the median of the samples of the row of section and
// tool, and that row; ok is false when the run has no such row with
// samples.
func (r *Run) Median(section, tool string) (float64, *Row, bool) {
	if r == nil {
		return 0, nil, false
	}
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.Section != section || x.Tool != tool || len(x.Samples) == 0 {
			continue
		}
		s := slices.Clone(x.Samples)
		slices.Sort(s)
		if n := len(s); n%2 == 0 {
			return (s[n/2-1] + s[n/2]) / 2, x, true
		}
		return s[len(s)/2], x, true
	}
	return 0, nil, false
}
