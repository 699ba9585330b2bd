package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"tine/sandbox"
)

// Approvals: what code inside a sandbox asks a person for (POST
// /v1/self/approvals, or a raise of its limits through POST
// /v1/self/resources). Each is a pending record that the daemon's API
// lists (GET /v1/approvals) and a person answers (tine approve|deny ID).
// The records live in the daemon's memory: a daemon that stops forgets
// them, and the sandboxes asking stop with it.

// Approval is one request a sandbox made of a person.
type Approval struct {
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	// Kind is "approval" (a question) or "resources" (a raise of limits).
	Kind   string `json:"kind"`
	Reason string `json:"reason,omitempty"`
	// Limits are the limits asked for (kind resources).
	Limits *sandbox.Limits `json:"limits,omitempty"`
	// State is pending, approved or denied.
	State    string     `json:"state"`
	Answer   string     `json:"answer,omitempty"` // the person's words
	Created  time.Time  `json:"created"`
	Answered *time.Time `json:"answered,omitempty"`
	// Frozen says the sandbox is frozen while the question waits (kind
	// approval; see inside_questions.go).
	Frozen bool `json:"frozen,omitempty"`
	// Deadline is when a question no one answered counts as denied (its
	// timeout_s); none when it waits for as long as it takes.
	Deadline *time.Time `json:"deadline,omitempty"`
	// TimedOut says no one answered before the deadline.
	TimedOut bool `json:"timed_out,omitempty"`
}

// ApprovalRequest is the body of POST /v1/self/approvals inside a sandbox.
type ApprovalRequest struct {
	// Reason says what is to be approved; the person sees it.
	Reason string `json:"reason"`
	// Wait: answer only once a person has (or the request's connection
	// ends), rather than at once with the pending record.
	Wait bool `json:"wait,omitempty"`
	// TimeoutS, when positive, is how many seconds a person has to
	// answer (at most a day): past it the question counts as denied and
	// the sandbox thaws.
	TimeoutS int64 `json:"timeout_s,omitempty"`
}

// AnswerRequest is the body of POST /v1/approvals/{id}/approve and /deny.
type AnswerRequest struct {
	Message string `json:"message,omitempty"`
}

// Bounds on what sandboxes may leave in the daemon's memory.
const (
	maxReason          = 1024
	maxPendingPerSB    = 16
	maxAnsweredKeptPer = 32
)

func validReason(s string) error {
	if len(s) > maxReason || !utf8.ValidString(s) {
		return badRequest("field \"reason\": want at most %d bytes of UTF-8", maxReason)
	}
	return nil
}

var approvalIDRE = regexp.MustCompile(`^ap-[0-9a-f]{16}$`)

// approvals is the daemon's record of them.
type approvals struct {
	mu   sync.Mutex
	byID map[string]*Approval
	// changed is closed (and replaced) at every answer.
	changed chan struct{}

	// holdMu guards holds: by sandbox, the questions keeping it frozen
	// (inside_questions.go). It is taken before mu, never after.
	holdMu sync.Mutex
	holds  map[string]map[string]bool
}

// add records a pending request (a's Sandbox, Kind, Reason, Limits,
// Frozen) with a deadline timeout from now when positive.
func (s *approvals) add(a *Approval, timeout time.Duration) (*Approval, error) {
	sb := a.Sandbox
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]*Approval{}
	}
	pending := 0
	var answered []*Approval
	for _, a := range s.byID {
		if a.Sandbox != sb {
			continue
		}
		if a.State == "pending" {
			pending++
		} else {
			answered = append(answered, a)
		}
	}
	if pending >= maxPendingPerSB {
		return nil, &Error{Code: "conflict", Message: fmt.Sprintf("sandbox %q has %d requests waiting for a person already; wait for an answer", sb, pending)}
	}
	if len(answered) >= maxAnsweredKeptPer {
		sort.Slice(answered, func(i, j int) bool { return answered[i].Created.Before(answered[j].Created) })
		for _, a := range answered[:len(answered)-maxAnsweredKeptPer+1] {
			delete(s.byID, a.ID)
		}
	}
	var b [8]byte
	rand.Read(b[:])
	a = &Approval{ID: "ap-" + hex.EncodeToString(b[:]), Sandbox: sb, Kind: a.Kind, Reason: a.Reason,
		Limits: a.Limits, Frozen: a.Frozen, State: "pending", Created: time.Now().UTC()}
	if timeout > 0 {
		d := a.Created.Add(timeout)
		a.Deadline = &d
	}
	s.byID[a.ID] = a
	c := *a
	return &c, nil
}

// get returns a copy of approval id and a channel closed at the next
// answer of any.
func (s *approvals) get(id string) (*Approval, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.byID[id]
	if !ok {
		return nil, s.changed
	}
	c := *a
	return &c, s.changed
}

// list returns copies of the approvals of sandbox sb (all when ""),
// oldest first.
func (s *approvals) list(sb string) []Approval {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Approval{}
	for _, a := range s.byID {
		if sb == "" || a.Sandbox == sb {
			out = append(out, *a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// answer records a person's answer to a pending approval; apply, when
// approving, runs first and its failure leaves it pending.
func (s *approvals) answer(id string, approve bool, msg string, apply func(*Approval) error) (*Approval, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.byID[id]
	if !ok {
		return nil, &Error{Code: "not_found", Message: fmt.Sprintf("approval %q: no such request; list them with tine approvals", id)}
	}
	if a.State != "pending" {
		return nil, &Error{Code: "conflict", Message: fmt.Sprintf("approval %q was %s already", id, a.State)}
	}
	if approve && apply != nil {
		if err := apply(a); err != nil {
			return nil, err
		}
	}
	s.settle(a, approve, msg)
	c := *a
	return &c, nil
}

// settle records the answer to a pending approval; s.mu is held.
func (s *approvals) settle(a *Approval, approve bool, msg string) {
	now := time.Now().UTC()
	a.State, a.Answer, a.Answered = map[bool]string{true: "approved", false: "denied"}[approve], msg, &now
	close(s.changed)
	s.changed = make(chan struct{})
}

// expire denies approval id if it is still pending, as timed out; it
// returns a copy of it then, or nil.
func (s *approvals) expire(id string) *Approval {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.byID[id]
	if !ok || a.State != "pending" {
		return nil
	}
	a.TimedOut = true
	msg := "no answer before the deadline"
	if a.Deadline != nil {
		msg = fmt.Sprintf("no answer within %s", a.Deadline.Sub(a.Created).Round(time.Second))
	}
	s.settle(a, false, msg)
	c := *a
	return &c
}

func (s *approvals) forget(sb string) {
	s.holdMu.Lock()
	delete(s.holds, sb)
	s.holdMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, a := range s.byID {
		if a.Sandbox == sb {
			delete(s.byID, id)
		}
	}
}

// Inside a sandbox: list (ask and look at one: inside_questions.go).

func (h *insideHandler) approvals(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, h.in.appr.list(h.self))
}

// On the daemon's API: list and answer.

// Approvals lists the sandboxes' requests for a person: all of them, or
// those of one sandbox.
func (in *Inside) Approvals(sb string) []Approval { return in.appr.list(sb) }

// Answer approves or denies a pending request. An approved raise of
// limits is applied to the sandbox at once (running or not), checked
// against the policy's ceiling again; an answered question thaws its
// sandbox once no other question of it waits. Answers are audited.
func (in *Inside) Answer(ctx context.Context, id string, approve bool, msg string) (*Approval, error) {
	if !approvalIDRE.MatchString(id) {
		return nil, badRequest("approval id %q: want ap- and 16 hex digits, as tine approvals lists", id)
	}
	a, err := in.appr.answer(id, approve, msg, func(a *Approval) error {
		if a.Kind != "resources" || a.Limits == nil {
			return nil
		}
		return in.applyApproved(context.WithoutCancel(ctx), a)
	})
	if err != nil {
		return nil, err
	}
	switch {
	case a.Kind == "resources" && !approve:
		in.m.Audit(a.Sandbox, "resources-denied", map[string]any{"id": a.ID, "asked": a.Limits, "answer": msg})
	case a.Kind == "approval":
		in.m.Audit(a.Sandbox, "question-answered", map[string]any{"id": a.ID, "state": a.State, "answer": msg})
		in.release(a)
	}
	return a, nil
}

func (s *Server) approvalsList(w http.ResponseWriter, r *http.Request) {
	sb := r.URL.Query().Get("sandbox")
	if sb != "" && !validName(sb) {
		writeError(w, badRequest("query sandbox=%q: want a sandbox name", sb))
		return
	}
	out := []Approval{}
	if s.o.Inside != nil {
		out = s.o.Inside.Approvals(sb)
	}
	// Commands held by their sandbox's exec policy (execpolicy.go).
	out = append(out, s.execApprovals(sb)...)
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) approve(w http.ResponseWriter, r *http.Request) { s.answer(w, r, true) }
func (s *Server) deny(w http.ResponseWriter, r *http.Request)    { s.answer(w, r, false) }

func (s *Server) answer(w http.ResponseWriter, r *http.Request, approve bool) {
	var req AnswerRequest
	if !decode(w, r, &req) {
		return
	}
	if err := validReason(req.Message); err != nil {
		writeError(w, badRequest("field \"message\": want at most %d bytes of UTF-8", maxReason))
		return
	}
	// A command held by its sandbox's exec policy (execpolicy.go).
	if a, ok, err := s.answerExec(r.PathValue("id"), approve, req.Message); ok {
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, a)
		return
	}
	if s.o.Inside == nil {
		writeError(w, &Error{Code: "not_found", Message: fmt.Sprintf("approval %q: this daemon serves no sandbox its own API", r.PathValue("id"))})
		return
	}
	a, err := s.o.Inside.Answer(r.Context(), r.PathValue("id"), approve, req.Message)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}
