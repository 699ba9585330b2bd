package api

import (
	"net/http"
	"strings"

	"tine/execpolicy"
)

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

// execApprovals lists the commands of sandbox sb (all when "") waiting
// for a person under their exec policy, as approvals of kind "exec".
func (s *Server) execApprovals(sb string) []Approval {
	var out []Approval
	for _, a := range s.m.Approvals() {
		if sb != "" && a.Sandbox != sb {
			continue
		}
		reason := strings.Join(a.Argv, " ")
		if a.Rule != "" {
			reason += " (rule " + a.Rule + ")"
		}
		if a.Frozen {
			reason += "; the sandbox is frozen meanwhile"
		}
		out = append(out, Approval{ID: a.ID, Sandbox: a.Sandbox, Kind: "exec", Reason: reason, State: "pending", Created: a.Asked})
	}
	return out
}

// answerExec answers a waiting command; ok is false when id is not one.
func (s *Server) answerExec(id string, approve bool, msg string) (*Approval, bool, error) {
	for _, a := range s.m.Approvals() {
		if a.ID != id {
			continue
		}
		if _, err := s.m.Decide(id, approve, msg); err != nil {
			return nil, true, err
		}
		state := "denied"
		if approve {
			state = "approved"
		}
		return &Approval{ID: a.ID, Sandbox: a.Sandbox, Kind: "exec", Reason: strings.Join(a.Argv, " "),
			State: state, Answer: msg, Created: a.Asked}, true, nil
	}
	return nil, false, nil
}
