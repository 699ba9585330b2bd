package api

import (
	"net/http"

	"tine/execpolicy"
	"tine/sandbox"
)

// ApprovalsResponse answers GET /v1/approvals.
type ApprovalsResponse struct {
	Approvals []*sandbox.Approval `json:"approvals"`
}

// DecisionRequest is the optional body of POST
// /v1/approvals/{id}/approve and /deny.
type DecisionRequest struct {
	// By names who decided, for the audit log.
	By string `json:"by,omitempty"`
}

func (s *Server) approvals(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, &ApprovalsResponse{Approvals: s.m.Approvals()})
}

func (s *Server) approve(w http.ResponseWriter, r *http.Request) { s.decide(w, r, true) }
func (s *Server) deny(w http.ResponseWriter, r *http.Request)    { s.decide(w, r, false) }

func (s *Server) decide(w http.ResponseWriter, r *http.Request, ok bool) {
	id := r.PathValue("id")
	if !validName(id) {
		writeError(w, badRequest("approval id %q: want the id tine approvals lists", id))
		return
	}
	var req DecisionRequest
	if r.ContentLength != 0 && !decode(w, r, &req) {
		return
	}
	if len(req.By) > 256 {
		writeError(w, badRequest("field \"by\": at most 256 bytes"))
		return
	}
	a, err := s.m.Decide(id, ok, req.By)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

// getExecPolicy answers GET /v1/sandboxes/{name}/policy/exec.
func (s *Server) getExecPolicy(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	p, err := s.m.ExecPolicy(name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// putExecPolicy answers PUT /v1/sandboxes/{name}/policy/exec: the whole
// new policy.
func (s *Server) putExecPolicy(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	var p execpolicy.Policy
	if !decode(w, r, &p) {
		return
	}
	if err := p.Check(); err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	if err := s.m.SetExecPolicy(name, &p); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, &p)
}
