// Package vmrun is the JSON form of a bench/vmm run (its --save file),
// which bench/report reads (--vmm) to draw the VM fork figures.
package vmrun

import (
	"slices"
	"time"

	"tine/bench/internal/runfile"
)

// Run is one run of bench/vmm.
type Run struct {
	Command   string    `json:"command"`
	Started   time.Time `json:"started"`
	Seconds   float64   `json:"seconds"`
	KVM       string    `json:"kvm"`        // the host's KVM: PVM, VMX or SVM
	LoadStart string    `json:"load_start"` // /proc/loadavg's first three fields
	LoadEnd   string    `json:"load_end"`
	Forks     []Fork    `json:"forks"`
	FanOut    []FanOut  `json:"fan_out"`
}

// Fork is the latency of one way of starting a guest (a fork method or
// a baseline) at one RAM size: fork to the first guest instruction.
type Fork struct {
	RAM      uint64    `json:"ram_bytes"`
	Method   string    `json:"method"`
	Baseline bool      `json:"baseline,omitempty"` // not a fork: what forks are compared with
	Samples  []float64 `json:"samples"`            // seconds, in the order taken
}

// FanOut is one fork of many children at once.
type FanOut struct {
	Children int     `json:"children"`
	Forked   float64 `json:"forked"`   // seconds until every child was made
	Answered float64 `json:"answered"` // seconds until every child ran its first instruction
}

// Quantile returns the q-quantile of f's samples (0 without samples).
func (f *Fork) Quantile(q float64) float64 {
	if len(f.Samples) == 0 {
		return 0
	}
	s := slices.Clone(f.Samples)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// Save writes r to path.
func (r *Run) Save(path string) error { return runfile.Save(path, r) }

// Load reads a run saved at path.
func Load(path string) (*Run, error) {
	var r Run
	if err := runfile.Load(path, "the VM results", &r); err != nil {
		return nil, err
	}
	return &r, nil
}
