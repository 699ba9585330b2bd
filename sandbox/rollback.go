package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"tine/internal/atomicfile"
)

// A rollback replaces two things, the sandbox's OS layer (its runtime
// directory) and its project branch, and a crash must not leave one
// replaced and the other not. It goes in three steps:
//
//  1. the snapshot's OS layer is copied to runtime.new beside the
//     sandbox's own (Runtime.CopyState is atomic and durable); a crash
//     here leaves the sandbox as it was, and recovery removes the copy;
//  2. rollback.json, naming the snapshot, is written durably: from here
//     on the rollback is done, whatever happens;
//  3. finishRollback puts runtime.new in place of runtime, resets the
//     branch to the snapshot, and removes rollback.json. Every step of it
//     can be done again, so recovery runs it for a rollback.json it finds.

// rollbackMark is rollback.json: the rollback under way.
type rollbackMark struct {
	Snapshot string `json:"snapshot"` // the snapshot's id
	FS       string `json:"fs"`       // its project snapshot (cowfs)
}

func (m *Manager) rollbackFile(name string) string { return filepath.Join(m.dir(name), "rollback.json") }
func (m *Manager) nextRtDir(name string) string    { return m.rtDir(name) + ".new" }

// Rollback returns the sandbox to snapshot id (its id or its label),
// which must be one of its own: the project and OS layer become the
// snapshot's and its processes start again.
func (m *Manager) Rollback(ctx context.Context, name, id string) error {
	done, err := m.ops.enter()
	if err != nil {
		return err
	}
	defer done()
	s, err := m.findSnapshot(name, id)
	if err != nil {
		return fmt.Errorf("rollback sandbox %q: %w", name, err)
	}
	info, err := m.Get(name)
	if err != nil {
		return err
	}
	if _, err := m.fs.Resolve(ctx, s.FS); err != nil {
		return fmt.Errorf("rollback sandbox %q: %w", name, err)
	}
	rt, err := m.runtimeOf(info)
	if err != nil {
		return fmt.Errorf("rollback: %w", err)
	}
	_, err = m.running(name)
	wasRunning := err == nil
	if err := m.Stop(ctx, name); err != nil {
		return err
	}
	next := m.nextRtDir(name)
	if err := os.RemoveAll(next); err != nil {
		return fmt.Errorf("rollback sandbox %q: %w", name, err)
	}
	if err := rt.CopyState(ctx, filepath.Join(m.snapDir(s.ID), "runtime"), next); err != nil {
		return fmt.Errorf("rollback sandbox %q: %w", name, err)
	}
	mark := rollbackMark{Snapshot: s.ID, FS: s.FS}
	if err := writeJSON(m.rollbackFile(name), mark); err != nil {
		os.RemoveAll(next)
		return fmt.Errorf("rollback sandbox %q: %w", name, err)
	}
	if err := m.finishRollback(ctx, info, mark); err != nil {
		return fmt.Errorf("rollback sandbox %q: %w (it is finished when the daemon next starts)", name, err)
	}
	m.audit(name, "rollback", map[string]any{"snapshot": s.ID})
	if wasRunning {
		return m.Start(ctx, name)
	}
	return nil
}

// finishRollback does step 3 of a rollback whose rollback.json is
// written (see above). The sandbox is stopped.
func (m *Manager) finishRollback(ctx context.Context, info *Info, mark rollbackMark) error {
	name := info.Name
	next := m.nextRtDir(name)
	if _, err := os.Lstat(next); err == nil {
		if err := os.RemoveAll(m.rtDir(name)); err != nil {
			return fmt.Errorf("remove the OS layer: %w", err)
		}
		if err := os.Rename(next, m.rtDir(name)); err != nil {
			return fmt.Errorf("put the snapshot's OS layer in place: %w", err)
		}
		if err := atomicfile.SyncDir(m.dir(name)); err != nil {
			return err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	snap, err := m.fs.Resolve(ctx, mark.FS)
	if err != nil {
		return err
	}
	if err := m.fs.Rollback(ctx, info.Branch, snap); err != nil {
		return err
	}
	// Removed durably: a rollback.json found again after later writes
	// would roll them back.
	if err := os.Remove(m.rollbackFile(name)); err != nil {
		return err
	}
	return atomicfile.SyncDir(m.dir(name))
}

// recoverRollback finishes the rollback of sandbox info that a crash
// interrupted after its rollback.json was written, or removes the copy
// of an OS layer one left before that. It reports what it did ("" for
// nothing).
func (m *Manager) recoverRollback(ctx context.Context, info *Info) (string, error) {
	var mark rollbackMark
	err := readJSON(m.rollbackFile(info.Name), &mark)
	if errors.Is(err, os.ErrNotExist) {
		next := m.nextRtDir(info.Name)
		if _, err := os.Lstat(next); err != nil {
			return "", nil
		}
		if err := os.RemoveAll(next); err != nil {
			return "", fmt.Errorf("remove the OS layer an interrupted rollback copied: %w", err)
		}
		return fmt.Sprintf("sandbox %q: removed the OS layer a rollback interrupted before it began had copied", info.Name), nil
	}
	if err == nil {
		err = m.finishRollback(ctx, info, mark)
	}
	if err != nil {
		return "", fmt.Errorf("finish an interrupted rollback: %w", err)
	}
	return fmt.Sprintf("sandbox %q: finished its rollback to %s, which a crash had interrupted", info.Name, mark.Snapshot), nil
}
