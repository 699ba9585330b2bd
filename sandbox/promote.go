package sandbox

import (
	"context"
	"fmt"

	"tine/cowfs"
)

// Promote applies the sandbox's project changes to the host directory it
// came from (ProjectPath): the changes from HostBase (the host directory
// as imported, or as last promoted into) to a snapshot of the project
// taken now with the sandbox frozen, after cowfs.Promote's conflict
// checks. Once applied, HostBase becomes that snapshot, so the next
// promotion carries only what changed since. A sandbox made from a
// snapshot that does not know its host directory is refused.
func (m *Manager) Promote(ctx context.Context, name string, o cowfs.PromoteOptions) (*cowfs.PromoteResult, error) {
	info, err := m.Get(name)
	if err != nil {
		return nil, err
	}
	if info.HostBase == "" {
		return nil, fmt.Errorf("promote sandbox %q: it was made from snapshot %s, which does not record the host directory it came from; export its changes instead (Diff)", name, info.From)
	}
	base, err := m.fs.Resolve(ctx, info.HostBase)
	if err != nil {
		return nil, fmt.Errorf("promote sandbox %q: its host base: %w", name, err)
	}
	var snap cowfs.SnapshotID
	err = m.freezeWhile(ctx, name, func() error {
		var err error
		snap, err = m.fs.Snapshot(ctx, info.Branch)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("promote sandbox %q: snapshot the project: %w", name, err)
	}
	res, err := m.fs.Promote(ctx, base, snap, info.ProjectPath, o)
	if err != nil {
		return res, fmt.Errorf("promote sandbox %q: %w", name, err)
	}
	if res.Applied {
		if info, err = m.Get(name); err != nil {
			return res, err
		}
		info.HostBase = snap.String()
		if err := m.save(info); err != nil {
			return res, fmt.Errorf("promote sandbox %q: applied, but recording the new base failed (the next promotion will report conflicts): %w", name, err)
		}
		m.audit(name, "promote", map[string]any{"to": info.ProjectPath, "snapshot": snap.String()})
	}
	return res, nil
}
