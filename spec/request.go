package spec

import (
	"fmt"
	"time"

	"tine/api"
	"tine/execpolicy"
	"tine/netpolicy"
	"tine/sandbox"
)

// The spec's policy fields as the daemon's API takes them: limits,
// network and secrets go in the create request; the exec policy and the
// exposed ports are set right after creation (Builder.Build).

// SandboxLimits are the spec's limits and lifetime as the API takes them.
func (s *Spec) SandboxLimits() (sandbox.Limits, error) {
	l := sandbox.Limits{Pids: s.Limits.Pids}
	var err error
	if s.Limits.Disk != "" {
		if l.ProjectBytes, err = ParseSize(s.Limits.Disk); err != nil {
			return l, fmt.Errorf("limits.disk: %w", err)
		}
	}
	if s.Limits.Memory != "" {
		if l.MemoryBytes, err = ParseSize(s.Limits.Memory); err != nil {
			return l, fmt.Errorf("limits.memory: %w", err)
		}
	}
	l.CPUs = s.Limits.CPUs
	if s.Lifetime != "" {
		if l.Lifetime, err = time.ParseDuration(s.Lifetime); err != nil {
			return l, fmt.Errorf("lifetime: %w", err)
		}
	}
	return l, nil
}

// NetworkRequest is the spec's network policy (nil: none given, which
// the daemon takes as mode none). An allow-list without a mode is mode
// allow.
func (s *Spec) NetworkRequest() (*api.NetworkRequest, error) {
	if s.Network == nil {
		return nil, nil
	}
	mode := s.Network.Mode
	if mode == "" && len(s.Network.Allow) > 0 {
		mode = string(netpolicy.Allow)
	}
	p, err := netpolicy.Parse(mode, s.Network.Allow)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	return &api.NetworkRequest{Mode: string(p.Mode), Allow: p.Allow}, nil
}

// SecretBindings are the spec's secrets as bindings of stored secrets.
func (s *Spec) SecretBindings() []sandbox.SecretBinding {
	var out []sandbox.SecretBinding
	for _, sec := range s.Secrets {
		out = append(out, sandbox.SecretBinding{Name: sec.Name, Host: sec.Destination, Header: sec.Header, Prefix: sec.Prefix})
	}
	return out
}

// ExecPolicy is the spec's exec policy (nil: none given).
func (s *Spec) ExecPolicy() (*execpolicy.Policy, error) {
	if s.Exec == nil {
		return nil, nil
	}
	p := &execpolicy.Policy{Rules: []execpolicy.Rule{}, FreezeOnAsk: s.Exec.FreezeOnAsk}
	for _, l := range []struct {
		pats []string
		a    execpolicy.Action
	}{{s.Exec.Allow, execpolicy.Allow}, {s.Exec.Ask, execpolicy.Ask}, {s.Exec.Deny, execpolicy.Deny}} {
		for _, pat := range l.pats {
			p.Rules = append(p.Rules, execpolicy.Rule{Pattern: pat, Action: l.a})
		}
	}
	if err := p.Check(); err != nil {
		return nil, err
	}
	return p, nil
}
