package api

import (
	"context"
	"net/http"

	"tine/sandbox"
)

// LimitsResponse answers GET and PUT /v1/sandboxes/{name}/limits.
type LimitsResponse struct {
	Limits sandbox.Limits `json:"limits"`
	// Usage is what the sandbox uses now; absent when it is stopped.
	Usage *sandbox.Usage `json:"usage,omitempty"`
	// Frozen says why the sandbox is frozen ("" when it is not).
	Frozen string `json:"frozen,omitempty"`
}

func (s *Server) limitsOf(name string, l sandbox.Limits) *LimitsResponse {
	resp := &LimitsResponse{Limits: l, Frozen: s.m.Frozen(name)}
	if u, err := s.m.Usage(name); err == nil {
		resp.Usage = u
	}
	return resp
}

// getLimits answers GET /v1/sandboxes/{name}/limits.
func (s *Server) getLimits(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	info, err := s.m.Get(name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.limitsOf(name, info.Limits))
}

// putLimits answers PUT /v1/sandboxes/{name}/limits: the whole new
// limits, applied to the running sandbox at once.
func (s *Server) putLimits(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	var l sandbox.Limits
	if !decode(w, r, &l) {
		return
	}
	if err := l.Check(); err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	info, err := s.m.UpdateLimits(context.WithoutCancel(r.Context()), name, l)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.limitsOf(name, info.Limits))
}

// freeze answers POST /v1/sandboxes/{name}/freeze.
func (s *Server) freeze(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok || !decodeEmpty(w, r) {
		return
	}
	if err := s.m.Freeze(context.WithoutCancel(r.Context()), name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// thaw answers POST /v1/sandboxes/{name}/thaw.
func (s *Server) thaw(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok || !decodeEmpty(w, r) {
		return
	}
	if err := s.m.Thaw(context.WithoutCancel(r.Context()), name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
