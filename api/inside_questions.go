package api

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"
)

// Questions asked from inside a sandbox (POST /v1/self/approvals) freeze
// it until a person answers: while any question of a sandbox is pending
// it is frozen with the cgroup freezer, as tine freeze does, and it thaws
// once the last one is answered or runs past its deadline (timeout_s,
// which counts as denied).
//
// The asking process is frozen too, so the order matters: the daemon
// freezes the sandbox first and writes the HTTP answer after, into the
// connection's socket buffer. The caller reads it once thawed: the
// pending record (202), or with "wait":true the answer itself (200). So
// nothing in the sandbox runs between the question and the freeze, and
// no answer is lost to it. A caller that did not wait reads the answer
// with GET /v1/self/approvals/{id} (?wait=DURATION waits for it).

// questionFreeze is why a sandbox with questions pending is frozen.
const questionFreeze = "waiting for a person to answer its question (tine approvals)"

// Bounds on waiting.
const (
	maxQuestionTimeout = 24 * 60 * 60 // seconds
	maxLongPoll        = 10 * time.Minute
	// freezeWithin bounds how long a freeze for a question may take.
	freezeWithin = 10 * time.Second
)

// parseWait parses the wait query parameter of GET
// /v1/self/approvals/{id}: a duration, at most maxLongPoll; "" is none.
func parseWait(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > maxLongPoll {
		return 0, badRequest("query wait=%q: want a duration such as 30s or 5m, at most %s", s, maxLongPoll)
	}
	return d, nil
}

// validate refuses a question no person could answer.
func (req *ApprovalRequest) validate() error {
	if err := validReason(req.Reason); err != nil {
		return err
	}
	if req.Reason == "" {
		return badRequest("field \"reason\" is empty: say what a person is to approve")
	}
	if req.TimeoutS < 0 || req.TimeoutS > maxQuestionTimeout {
		return badRequest("field \"timeout_s\": %d: want 0 (wait until answered) to %d (a day)", req.TimeoutS, maxQuestionTimeout)
	}
	return nil
}

// ask answers POST /v1/self/approvals: the question is recorded, the
// sandbox frozen, and then the answer written (see above).
func (h *insideHandler) ask(w http.ResponseWriter, r *http.Request) {
	var req ApprovalRequest
	if !decode(w, r, &req) {
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, err)
		return
	}
	timeout := time.Duration(req.TimeoutS) * time.Second
	a, err := h.in.appr.add(&Approval{Sandbox: h.self, Kind: "approval", Reason: req.Reason, Frozen: true}, timeout)
	if err != nil {
		writeError(w, err)
		return
	}
	h.in.m.Audit(h.self, "question-asked", map[string]any{"id": a.ID, "reason": a.Reason, "timeout_s": req.TimeoutS})
	if timeout > 0 {
		time.AfterFunc(timeout, func() { h.in.expire(a.ID) })
	}
	if err := h.in.hold(context.WithoutCancel(r.Context()), a); err != nil {
		// Still pending, but the sandbox runs on: a person answers as
		// ever, and the record says it is not frozen.
		fmt.Fprintf(os.Stderr, "tine: sandbox %q: freeze for question %s: %v\n", h.self, a.ID, err)
		h.in.appr.notFrozen(a.ID)
		a.Frozen = false
	}
	if !req.Wait {
		writeJSON(w, http.StatusAccepted, a)
		return
	}
	h.waitAnswer(w, r, a, 0)
}

// waitAnswer writes approval a once it is answered, once wait has passed
// (when positive), or not at all when the request ends first.
func (h *insideHandler) waitAnswer(w http.ResponseWriter, r *http.Request, a *Approval, wait time.Duration) {
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		cur, changed := h.in.appr.get(a.ID)
		if cur == nil {
			cur = a // dropped meanwhile (its sandbox removed)
		}
		if cur.State != "pending" {
			writeJSON(w, http.StatusOK, cur)
			return
		}
		select {
		case <-changed:
		case <-deadline:
			writeJSON(w, http.StatusOK, cur)
			return
		case <-r.Context().Done():
			return
		}
	}
}

// approval answers GET /v1/self/approvals/{id}[?wait=DURATION]: one of
// the sandbox's own requests, once answered or once the wait has passed.
func (h *insideHandler) approval(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a, _ := h.in.appr.get(id)
	if !approvalIDRE.MatchString(id) || a == nil || a.Sandbox != h.self {
		writeError(w, &Error{Code: "not_found", Message: fmt.Sprintf("approval %q: no such request of this sandbox", id)})
		return
	}
	wait, err := parseWait(r.URL.Query().Get("wait"))
	if err != nil {
		writeError(w, err)
		return
	}
	if wait == 0 {
		writeJSON(w, http.StatusOK, a)
		return
	}
	h.waitAnswer(w, r, a, wait)
}

// hold freezes question a's sandbox for it, unless it was answered
// already. The freeze is made under holdMu, and release looks at the
// holds after the answer is recorded, so that no answer slips between
// the check and the freeze to leave the sandbox frozen for nothing.
func (in *Inside) hold(ctx context.Context, a *Approval) error {
	s := &in.appr
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	if cur, _ := s.get(a.ID); cur == nil || cur.State != "pending" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, freezeWithin)
	defer cancel()
	if err := in.m.FreezeFor(ctx, a.Sandbox, questionFreeze); err != nil {
		return err
	}
	if s.holds == nil {
		s.holds = map[string]map[string]bool{}
	}
	if s.holds[a.Sandbox] == nil {
		s.holds[a.Sandbox] = map[string]bool{}
	}
	s.holds[a.Sandbox][a.ID] = true
	return nil
}

// release drops answered question a's hold on its sandbox, and thaws
// the sandbox when no other question holds it (and nothing else froze
// it: a person's freeze stays).
func (in *Inside) release(a *Approval) {
	s := &in.appr
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	held := s.holds[a.Sandbox]
	if !held[a.ID] {
		return
	}
	delete(held, a.ID)
	if len(held) > 0 {
		return
	}
	delete(s.holds, a.Sandbox)
	in.m.ThawFor(a.Sandbox, questionFreeze)
}

// notFrozen records that question id does not keep its sandbox frozen.
func (s *approvals) notFrozen(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.byID[id]; ok {
		a.Frozen = false
	}
}

// expire denies question id as timed out, if it is still pending, and
// releases its sandbox.
func (in *Inside) expire(id string) {
	if in.ctx.Err() != nil {
		return // the daemon is stopping, and its sandboxes with it
	}
	a := in.appr.expire(id)
	if a == nil {
		return
	}
	in.m.Audit(a.Sandbox, "question-answered", map[string]any{"id": a.ID, "state": a.State, "timed_out": true})
	in.release(a)
}
