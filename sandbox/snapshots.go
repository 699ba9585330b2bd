package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// checkLabel says whether label can name a new snapshot of sandbox name:
// it has the form of a sandbox name, does not look like a snapshot id and
// no other snapshot of the sandbox carries it.
func (m *Manager) checkLabel(name, label string) error {
	if !nameRE().MatchString(label) || strings.HasPrefix(label, "snap-") {
		return fmt.Errorf("snapshot sandbox %q: bad label %q (want 1-63 of [A-Za-z0-9._-], not starting with snap-)", name, label)
	}
	snaps, err := m.Snapshots(name)
	if err != nil {
		return err
	}
	for _, s := range snaps {
		if s.Name == label {
			return fmt.Errorf("snapshot sandbox %q: label %q is taken by %s: %w", name, label, s.ID, ErrExists)
		}
	}
	return nil
}

// Snapshots lists sandbox name's snapshots, oldest first. The snapshots
// of a removed sandbox are still listed under its name.
func (m *Manager) Snapshots(name string) ([]*SnapshotInfo, error) {
	if !nameRE().MatchString(name) {
		return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
	}
	ents, err := os.ReadDir(filepath.Join(m.root, "snapshots"))
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var out []*SnapshotInfo
	for _, e := range ents {
		s, err := m.GetSnapshot(e.Name())
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrDamaged) {
			continue // being made or removed; or no telling whose (Open reports it)
		}
		if err != nil {
			return nil, err
		}
		if s.Sandbox == name {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// findSnapshot returns the snapshot of sandbox name whose id or label is
// ref.
func (m *Manager) findSnapshot(name, ref string) (*SnapshotInfo, error) {
	if strings.HasPrefix(ref, "snap-") {
		s, err := m.GetSnapshot(ref)
		if err != nil {
			return nil, err
		}
		if s.Sandbox != name {
			return nil, fmt.Errorf("snapshot %s belongs to sandbox %q, not %q", ref, s.Sandbox, name)
		}
		return s, nil
	}
	snaps, err := m.Snapshots(name)
	if err != nil {
		return nil, err
	}
	for _, s := range snaps {
		if s.Name == ref {
			return s, nil
		}
	}
	return nil, fmt.Errorf("snapshot %q of sandbox %q (neither an id nor a label of it): %w", ref, name, ErrNotFound)
}
