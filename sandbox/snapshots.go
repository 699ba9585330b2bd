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
	"strings"
	"time"

	"tine/internal/atomicfile"
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

// Snapshot fixes the sandbox at one instant, labelled o.Name if given
// (unique among the sandbox's snapshots): with its processes frozen it
// snapshots the project branch and copies the runtime's state, then thaws
// them. A stopped sandbox is snapshotted as it is.
func (m *Manager) Snapshot(ctx context.Context, name string, o SnapshotOptions) (*SnapshotInfo, error) {
	if o.Name != "" {
		defer m.ext.labels.lock(name)()
	}
	s, save, err := m.snapshot(ctx, name, o)
	if err != nil {
		return nil, err
	}
	if err := save(); err != nil {
		return nil, err
	}
	return s, nil
}

// snapshot takes the snapshot Snapshot describes and returns it with the
// function that writes its metadata, without which it is removed (and
// which removes it on failure). A labelled snapshot needs the sandbox's
// lock in ext.labels held from before this call until save returns.
func (m *Manager) snapshot(ctx context.Context, name string, o SnapshotOptions) (*SnapshotInfo, func() error, error) {
	info, err := m.Get(name)
	if err != nil {
		return nil, nil, err
	}
	if o.Name != "" {
		if err := m.checkLabel(name, o.Name); err != nil {
			return nil, nil, err
		}
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	s := &SnapshotInfo{ID: "snap-" + hex.EncodeToString(rnd[:]), Name: o.Name, Sandbox: name, Runtime: info.Runtime,
		ProjectPath: info.ProjectPath, Created: time.Now().UTC(), Limits: info.Limits, Guest: info.Guest, Env: info.Env,
		Services: info.Services, HostBase: info.HostBase, GitBase: info.GitBase, Image: info.Image}
	dir := m.snapDir(s.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("snapshot sandbox %q: %w", name, err)
	}
	rt, err := m.runtimeOf(info)
	if err != nil {
		os.Remove(dir)
		return nil, nil, err
	}
	// The runtime's state is read frozen; a runtime that can make it
	// durable after the thaw does so then, so the sandbox does not wait
	// on the disk (a syncfs waits for all the file system's dirty pages).
	from, to := m.rtDir(name), filepath.Join(dir, "runtime")
	finish := func() error { return nil }
	if sc, ok := rt.(StateCapturer); ok {
		if _, err := m.running(name); err == nil {
			if err := sc.PrepareState(ctx, from, to); err != nil {
				os.RemoveAll(dir)
				return nil, nil, fmt.Errorf("snapshot sandbox %q: %w", name, err)
			}
		}
	}
	err = m.freezeWhile(ctx, name, func() error {
		id, err := m.fs.Snapshot(ctx, info.Branch)
		if err != nil {
			return err
		}
		s.FS = id.String()
		if sc, ok := rt.(StateCapturer); ok {
			finish, err = sc.CaptureState(ctx, from, to)
			return err
		}
		return rt.CopyState(ctx, from, to)
	})
	if err == nil {
		err = finish()
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("snapshot sandbox %q: %w", name, err)
	}
	save := func() error {
		if err := writeJSON(filepath.Join(dir, "snapshot.json"), s); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("snapshot sandbox %q: %w", name, err)
		}
		m.audit(name, "snapshot", map[string]any{"id": s.ID, "name": s.Name})
		return nil
	}
	return s, save, nil
}

// freezeWhile runs fn with the sandbox's processes frozen, if it runs.
func (m *Manager) freezeWhile(ctx context.Context, name string, fn func() error) error {
	l, err := m.running(name)
	if errors.Is(err, ErrNotRunning) || m.frozenWhy(name) != "" {
		return fn() // not running, or frozen already (and kept so)
	}
	if err := l.inst.Freeze(ctx); err != nil {
		return errors.Join(err, l.inst.Thaw(context.Background()))
	}
	err = fn()
	return errors.Join(err, l.inst.Thaw(context.Background()))
}

// createSnapshot returns the metadata of the snapshot a create from
// o.Snapshot starts from: a fork's from memory (its file may not be
// written yet), else GetSnapshot's.
func (m *Manager) createSnapshot(o CreateOptions) (*SnapshotInfo, error) {
	if o.forkOf != nil {
		return o.forkOf, nil
	}
	return m.GetSnapshot(o.Snapshot)
}

// GetSnapshot returns a sandbox snapshot's metadata.
func (m *Manager) GetSnapshot(id string) (*SnapshotInfo, error) {
	var s SnapshotInfo
	if !nameRE().MatchString(id) {
		return nil, fmt.Errorf("sandbox snapshot %q: %w", id, ErrNotFound)
	}
	if err := readJSON(filepath.Join(m.snapDir(id), "snapshot.json"), &s); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("sandbox snapshot %q: %w", id, ErrNotFound)
		}
		return nil, fmt.Errorf("sandbox snapshot %q: %w (%v)", id, ErrDamaged, err)
	}
	return &s, nil
}

// RemoveSnapshot deletes a sandbox snapshot's files (the cowfs snapshot
// stays in the store).
func (m *Manager) RemoveSnapshot(id string) error {
	if _, err := m.GetSnapshot(id); err != nil {
		return err
	}
	// snapshot.json goes first, durably: a removal cut short then leaves
	// a directory that Open deletes, never a listed snapshot with part of
	// its OS layer.
	dir := m.snapDir(id)
	if err := os.Remove(filepath.Join(dir, "snapshot.json")); err != nil {
		return fmt.Errorf("remove snapshot %s: %w", id, err)
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return fmt.Errorf("remove snapshot %s: %w", id, err)
	}
	return os.RemoveAll(dir)
}
