package sandbox

import (
	"fmt"
	"sort"

	"tine/netpolicy"
)

// A Manager runs sandboxes of several runtimes: Options.Runtime, the
// default, and Options.Runtimes. Each sandbox records its runtime's name
// (Info.Runtime) and every start, snapshot, rollback and stop of it uses
// that runtime; a sandbox made from a snapshot (a fork among them) takes
// the snapshot's runtime.

// Features says which of the Manager's host-side parts a runtime's
// sandboxes support. A Runtime that is not a Featurer supports them all.
type Features struct {
	// Network: a network policy other than none (the filter, the veth and
	// the gateway) and host ports forwarded into the sandbox.
	Network bool
	// Limits: the cgroup-based limits (pids, CPU, memory, IO, tmpfs, OS
	// layer, devices, GPU) and usage; the project quota and the lifetime
	// are the Manager's own and work for every runtime.
	Limits bool
	// APISocket: the inside API's socket bound at /run/tine/api.sock
	// (Spec.APISocket).
	APISocket bool
}

// Featurer is a Runtime that supports only some of the Manager's
// host-side parts.
type Featurer interface {
	Features() Features
}

// featuresOf returns what rt supports.
func featuresOf(rt Runtime) Features {
	if f, ok := rt.(Featurer); ok {
		return f.Features()
	}
	return Features{Network: true, Limits: true, APISocket: true}
}

// initRuntimes registers opts' runtimes by name.
func (m *Manager) initRuntimes(opts Options) error {
	m.rts = map[string]Runtime{}
	for _, rt := range append([]Runtime{opts.Runtime}, opts.Runtimes...) {
		if rt == nil {
			return fmt.Errorf("sandbox manager: a nil runtime in Options.Runtimes")
		}
		if _, ok := m.rts[rt.Name()]; ok {
			return fmt.Errorf("sandbox manager: two runtimes named %q", rt.Name())
		}
		m.rts[rt.Name()] = rt
	}
	return nil
}

// Runtimes names the runtimes this manager runs sandboxes with, sorted.
func (m *Manager) Runtimes() []string {
	out := make([]string, 0, len(m.rts))
	for n := range m.rts {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// runtimeNamed returns the runtime called name ("" is the default).
func (m *Manager) runtimeNamed(name string) (Runtime, error) {
	if name == "" {
		return m.rt, nil
	}
	rt, ok := m.rts[name]
	if !ok {
		return nil, fmt.Errorf("runtime %q is not one this manager runs (it runs %v): start the daemon where that runtime can run", name, m.Runtimes())
	}
	return rt, nil
}

// runtimeOf returns the runtime of a sandbox.
func (m *Manager) runtimeOf(info *Info) (Runtime, error) {
	rt, err := m.runtimeNamed(info.Runtime)
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", info.Name, err)
	}
	return rt, nil
}

// runtimeNameOf names a sandbox's runtime, for messages.
func (m *Manager) runtimeNameOf(name string) string {
	if info, err := m.Get(name); err == nil && info.Runtime != "" {
		return info.Runtime
	}
	return m.rt.Name()
}

// pickRuntime chooses a new sandbox's runtime: a snapshot's when made
// from one (o.Runtime, if given, must agree), else o.Runtime or the
// default. It refuses what the runtime's sandboxes cannot have.
func (m *Manager) pickRuntime(o CreateOptions) (Runtime, error) {
	want := o.Runtime
	if o.Snapshot != "" {
		s, err := m.createSnapshot(o)
		if err != nil {
			return nil, err
		}
		if want != "" && s.Runtime != "" && want != s.Runtime {
			return nil, fmt.Errorf("snapshot %s is of a %s sandbox: a sandbox made from it runs %s, not %s", s.ID, s.Runtime, s.Runtime, want)
		}
		if s.Runtime != "" {
			want = s.Runtime
		}
	}
	rt, err := m.runtimeNamed(want)
	if err != nil {
		return nil, err
	}
	f := featuresOf(rt)
	if !f.Network {
		if o.Network != nil && (o.Network.GetMode() != netpolicy.None || len(o.Network.Allow) > 0) {
			return nil, fmt.Errorf("network policy is not built for %s sandboxes: use network mode none", rt.Name())
		}
		if o.AutoExpose {
			return nil, fmt.Errorf("port forwarding (auto-expose) is not built for %s sandboxes", rt.Name())
		}
	}
	if !f.Limits {
		if err := checkNoCgroupLimits(rt.Name(), o.Limits); err != nil {
			return nil, err
		}
	}
	return rt, nil
}

// checkNoCgroupLimits refuses limits that only cgroups enforce.
func checkNoCgroupLimits(rtName string, l Limits) error {
	l.ProjectBytes, l.Lifetime, l.Idle = 0, 0, 0 // the Manager's own
	if l.IsZero() {
		return nil
	}
	return fmt.Errorf("limits other than the project quota, lifetime and idle time are not built for %s sandboxes (they are cgroup limits): size a %s sandbox with its guest size (create --memory and --cpus)", rtName, rtName)
}

// checkFeature refuses a part of the Manager that the sandbox's runtime
// does not support (what: "network policy" or "limits").
func (m *Manager) checkFeature(name, what string, needs func(Features) bool) error {
	info, err := m.Get(name)
	if err != nil {
		return err
	}
	rt, err := m.runtimeOf(info)
	if err != nil {
		return err
	}
	if !needs(featuresOf(rt)) {
		return fmt.Errorf("sandbox %q: %s is not built for %s sandboxes", name, what, rt.Name())
	}
	return nil
}

// guestSize returns a new sandbox's machine size: o.Guest, else a
// snapshot's, with the runtime's defaults filled in; nil for a runtime
// that is not a GuestSizer, which refuses a size.
func (m *Manager) guestSize(rt Runtime, o CreateOptions) (*GuestSize, error) {
	want := o.Guest
	if o.Snapshot != "" {
		s, err := m.createSnapshot(o)
		if err != nil {
			return nil, err
		}
		if s.Guest != nil {
			if want != nil && (want.MemoryBytes != 0 && want.MemoryBytes != s.Guest.MemoryBytes || want.CPUs != 0 && want.CPUs != s.Guest.CPUs) {
				return nil, fmt.Errorf("snapshot %s is of a machine with %d MiB and %d vCPUs: a sandbox made from it has that size", s.ID, s.Guest.MemoryBytes>>20, s.Guest.CPUs)
			}
			want = s.Guest
		}
	}
	gs, ok := rt.(GuestSizer)
	if !ok {
		if o.Guest != nil {
			return nil, fmt.Errorf("a guest size (memory and vCPUs of a machine) is for vm sandboxes; size a %s sandbox with limits", rt.Name())
		}
		return nil, nil
	}
	g, err := gs.GuestSize(want)
	if err != nil {
		return nil, err
	}
	return &g, nil
}
