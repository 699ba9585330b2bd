package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
)

// InsideAPI serves each sandbox its own API on a Unix socket that the
// runtime binds inside it (Spec.APISocket); package api's Inside is one.
// The socket a request comes in on is the only thing that says which
// sandbox asks.
type InsideAPI interface {
	// Listen makes sure a socket at path serves sandbox name; it is
	// called before every start of the sandbox.
	Listen(name, path string) error
	// Forget stops serving sandbox name; it is called when it is removed.
	Forget(name string)
}

// SetInsideAPI makes every sandbox started from now on reach its own API
// served by a, at /run/tine/api.sock.
func (m *Manager) SetInsideAPI(a InsideAPI) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inside = a
}

// insideSocket has the sandbox's API socket served and returns its host
// path, or "" when no InsideAPI is set.
func (m *Manager) insideSocket(name string) (string, error) {
	m.mu.Lock()
	a := m.inside
	m.mu.Unlock()
	if a == nil {
		return "", nil
	}
	p := filepath.Join(m.dir(name), "api.sock")
	if err := a.Listen(name, p); err != nil {
		return "", fmt.Errorf("sandbox %q: its api socket: %w", name, err)
	}
	return p, nil
}

// forgetInside stops serving the sandbox's API socket.
func (m *Manager) forgetInside(name string) {
	m.mu.Lock()
	a := m.inside
	m.mu.Unlock()
	if a != nil {
		a.Forget(name)
	}
}

// InTree says whether sandbox name is root or one of its forks, at any
// depth, as their metadata records them (Info.ForkedFrom).
func (m *Manager) InTree(root, name string) bool {
	for seen := 0; seen < 1000 && name != ""; seen++ {
		if name == root {
			return true
		}
		info, err := m.Get(name)
		if err != nil {
			return false
		}
		name = info.ForkedFrom
	}
	return false
}

// FreezeFor freezes a running sandbox for why, as Freeze does, unless
// it is frozen already (for why or anything else); ThawFor(why) thaws it.
// The freeze is audited with why.
func (m *Manager) FreezeFor(ctx context.Context, name, why string) error {
	if err := m.freeze(ctx, name, why); err != nil {
		return err
	}
	m.audit(name, "freeze", map[string]any{"why": why})
	return nil
}

// ThawFor thaws a sandbox that FreezeFor froze for why; one frozen for
// another reason (by a person, over its OS-layer bound) stays frozen. It
// reports whether it thawed the sandbox; the thaw is audited.
func (m *Manager) ThawFor(name, why string) bool {
	if !m.thawIf(name, why) {
		return false
	}
	m.audit(name, "thaw", map[string]any{"why": why})
	return true
}
