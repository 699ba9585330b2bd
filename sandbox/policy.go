package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"tine/execpolicy"
	"tine/guestagent/proto"
)

// Errors of the exec policy and the freezer.
var (
	// ErrDenied reports a command the sandbox's exec policy, or a person,
	// refused.
	ErrDenied = errors.New("denied")
	// ErrFrozen reports a sandbox frozen on purpose (tine freeze, or a
	// pending approval): thaw it first.
	ErrFrozen = errors.New("frozen")
)

// policyEntry is a sandbox's exec policy as loaded.
type policyEntry struct{ p *execpolicy.Policy }

func (m *Manager) policyPath(name string) string { return filepath.Join(m.dir(name), "policy.json") }

// ExecPolicy returns the sandbox's exec policy (empty: everything is
// allowed).
func (m *Manager) ExecPolicy(name string) (*execpolicy.Policy, error) {
	m.pol.mu.Lock()
	e := m.pol.policies[name]
	m.pol.mu.Unlock()
	if e != nil {
		return e.p, nil // dropped when the sandbox stops (forgetWatch)
	}
	if _, err := m.Get(name); err != nil {
		return nil, err
	}
	p := &execpolicy.Policy{Rules: []execpolicy.Rule{}}
	if err := readJSON(m.policyPath(name), p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %q: exec policy: %w", name, err)
	}
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", name, err)
	}
	m.pol.mu.Lock()
	if m.pol.policies == nil {
		m.pol.policies = map[string]*policyEntry{}
	}
	m.pol.policies[name] = &policyEntry{p}
	m.pol.mu.Unlock()
	return p, nil
}

// SetExecPolicy replaces the sandbox's exec policy; the change is
// audited. It applies to commands started from now on.
func (m *Manager) SetExecPolicy(name string, p *execpolicy.Policy) error {
	if err := p.Check(); err != nil {
		return fmt.Errorf("sandbox %q: %w", name, err)
	}
	old, err := m.ExecPolicy(name)
	if err != nil {
		return err
	}
	if p.Rules == nil {
		p.Rules = []execpolicy.Rule{}
	}
	if err := writeJSON(m.policyPath(name), p); err != nil {
		return fmt.Errorf("sandbox %q: exec policy: %w", name, err)
	}
	m.pol.mu.Lock()
	m.pol.policies[name] = &policyEntry{p}
	m.pol.mu.Unlock()
	m.audit(name, "exec-policy", map[string]any{"old": old, "new": p})
	return nil
}

// Approval is a command waiting for a person's yes or no.
type Approval struct {
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Argv    []string  `json:"argv"`
	Cwd     string    `json:"cwd,omitempty"`
	Rule    string    `json:"rule,omitempty"`
	Asked   time.Time `json:"asked"`
	// Frozen says the sandbox is frozen while it waits.
	Frozen bool `json:"frozen,omitempty"`
}

// Approvals lists the commands waiting for a person, oldest first.
func (m *Manager) Approvals() []*Approval {
	m.pol.mu.Lock()
	defer m.pol.mu.Unlock()
	out := make([]*Approval, 0, len(m.pol.approvals))
	for _, a := range m.pol.approvals {
		c := *a
		out = append(out, &c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Asked.Before(out[j].Asked) })
	return out
}

// Decide approves or denies a waiting command; the decision is audited.
func (m *Manager) Decide(id string, approve bool, by string) (*Approval, error) {
	m.pol.mu.Lock()
	a := m.pol.approvals[id]
	w := m.pol.waiters[id]
	if a != nil {
		delete(m.pol.approvals, id)
		delete(m.pol.waiters, id)
	}
	m.pol.mu.Unlock()
	if a == nil {
		return nil, fmt.Errorf("approval %q: %w (tine approvals lists those waiting)", id, ErrNotFound)
	}
	kind := "approval-denied"
	if approve {
		kind = "approval-granted"
	}
	m.audit(a.Sandbox, kind, map[string]any{"id": id, "argv": a.Argv, "by": by})
	w <- approve
	return a, nil
}

// checkExec applies the sandbox's exec policy to req. An ask waits for
// Decide (freezing the sandbox meanwhile when the policy says so) or for
// ctx to end. It returns what decided, for the exec's audit record.
func (m *Manager) checkExec(ctx context.Context, name string, req proto.ExecRequest) (string, error) {
	if why := m.frozenWhy(name); why != "" && why != "idle" {
		return "", fmt.Errorf("exec in sandbox %q: it is %w (%s); tine thaw %s first", name, ErrFrozen, why, name)
	}
	m.touch(name)
	p, err := m.ExecPolicy(name)
	if err != nil {
		return "", err
	}
	d := p.Decide(req.Argv)
	how := string(d.Action)
	if d.Rule != "" {
		how += " by rule " + d.Rule
	}
	switch d.Action {
	case execpolicy.Allow:
		return how, nil
	case execpolicy.Deny:
		m.audit(name, "exec-denied", map[string]any{"argv": req.Argv, "cwd": req.Dir, "rule": d.Rule, "command": d.Command})
		return "", fmt.Errorf("exec %q in sandbox %q: %w by the exec policy (rule %q); change it with tine exec-policy %s", req.Argv, name, ErrDenied, d.Rule, name)
	}
	var rnd [8]byte // the form of the API's approval ids: ap- and 16 hex digits
	rand.Read(rnd[:])
	a := &Approval{ID: "ap-" + hex.EncodeToString(rnd[:]), Sandbox: name, Argv: req.Argv, Cwd: req.Dir,
		Rule: d.Rule, Asked: time.Now().UTC(), Frozen: p.FreezeOnAsk}
	w := make(chan bool, 1)
	if a.Frozen {
		// Frozen before it is listed, so that whoever sees it waiting
		// sees the sandbox frozen.
		if err := m.freeze(ctx, name, "waiting for approval "+a.ID); err != nil {
			return "", fmt.Errorf("exec %q in sandbox %q: the policy asks for approval with the sandbox frozen: %w", req.Argv, name, err)
		}
	}
	m.pol.mu.Lock()
	if m.pol.approvals == nil {
		m.pol.approvals, m.pol.waiters = map[string]*Approval{}, map[string]chan bool{}
	}
	m.pol.approvals[a.ID], m.pol.waiters[a.ID] = a, w
	m.pol.mu.Unlock()
	m.audit(name, "approval-asked", map[string]any{"id": a.ID, "argv": req.Argv, "cwd": req.Dir, "rule": d.Rule})
	m.publish(name, "approval-asked")
	var ok bool
	select {
	case ok = <-w:
	case <-ctx.Done():
		m.pol.mu.Lock()
		_, still := m.pol.approvals[a.ID]
		delete(m.pol.approvals, a.ID)
		delete(m.pol.waiters, a.ID)
		m.pol.mu.Unlock()
		if still {
			m.audit(name, "approval-abandoned", map[string]any{"id": a.ID})
		} else {
			ok = <-w
		}
	}
	if a.Frozen {
		m.thawIf(name, "waiting for approval "+a.ID)
	}
	if ctx.Err() != nil && !ok {
		return "", fmt.Errorf("exec %q in sandbox %q: approval %s: %w", req.Argv, name, a.ID, ctx.Err())
	}
	if !ok {
		return "", fmt.Errorf("exec %q in sandbox %q: %w by a person (approval %s)", req.Argv, name, ErrDenied, a.ID)
	}
	return "approved " + a.ID, nil
}

// inheritPolicy gives a fork its parent's exec policy.
func (m *Manager) inheritPolicy(parent, child string) {
	if parent == "" {
		return
	}
	p, err := m.ExecPolicy(parent)
	if err != nil || len(p.Rules) == 0 {
		return
	}
	if err := writeJSON(m.policyPath(child), p); err != nil {
		fmt.Fprintf(os.Stderr, "tine: sandbox %q: inherit the exec policy of %q: %v\n", child, parent, err)
	}
}
