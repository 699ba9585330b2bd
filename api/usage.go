package api

import (
	"errors"
	"net/http"
	"time"

	"tine/sandbox"
)

// UsageResponse answers GET /v1/usage: what every sandbox uses now, in
// one call.
type UsageResponse struct {
	// Time is when the counters were read; two responses give CPU use as
	// the change of cpu_ns over the change of time.
	Time      time.Time      `json:"time"`
	Sandboxes []SandboxUsage `json:"sandboxes"`
}

// SandboxUsage is one sandbox's limits and use. Nothing in it asks the
// sandbox's agent: the counters come from its cgroups and the store, so
// a frozen sandbox answers as fast as a running one.
type SandboxUsage struct {
	Name  string        `json:"name"`
	State sandbox.State `json:"state"`
	// Frozen says why the sandbox is frozen ("" when it is not).
	Frozen string         `json:"frozen,omitempty"`
	Limits sandbox.Limits `json:"limits"`
	// ProjectBytes is the bytes charged to its project branch.
	ProjectBytes int64 `json:"project_bytes"`
	// LayerBoundBytes is the bound of its OS layer in force:
	// Limits.LayerBytes, or sandbox.DefaultLayerBytes when that is 0.
	LayerBoundBytes int64 `json:"layer_bound_bytes"`
	// Usage is what its cgroups count; absent when it is stopped or its
	// runtime reports none (UsageError then says why).
	Usage      *sandbox.Usage `json:"usage,omitempty"`
	UsageError string         `json:"usage_error,omitempty"`
}

// usage answers GET /v1/usage.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	infos, err := s.m.List()
	if err != nil {
		writeError(w, err)
		return
	}
	out := &UsageResponse{Time: time.Now().UTC(), Sandboxes: make([]SandboxUsage, 0, len(infos))}
	for _, in := range infos {
		su := SandboxUsage{Name: in.Name, State: in.State, Limits: in.Limits, Frozen: s.m.Frozen(in.Name),
			LayerBoundBytes: in.Limits.LayerBytes}
		if in.State == sandbox.Damaged {
			su.UsageError = in.Problem
			out.Sandboxes = append(out.Sandboxes, su)
			continue
		}
		if su.LayerBoundBytes == 0 {
			su.LayerBoundBytes = sandbox.DefaultLayerBytes
		}
		su.ProjectBytes, err = s.m.ProjectBytes(r.Context(), in.Name)
		if errors.Is(err, sandbox.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			writeError(w, err)
			return
		}
		switch u, err := s.m.Usage(in.Name); {
		case err == nil:
			su.Usage = u
		case !errors.Is(err, sandbox.ErrNotRunning):
			su.UsageError = err.Error()
		}
		out.Sandboxes = append(out.Sandboxes, su)
	}
	writeJSON(w, http.StatusOK, out)
}
