package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"tine/guestagent/proto"
	"tine/internal/atomicfile"
)

// A rollback replaces two things, the sandbox's OS layer (its runtime
// directory) and its project branch, and a crash must not leave one
// replaced and the other not:
//
//  1. rollback.json, naming the snapshot, is written durably;
//  2. runtime is renamed runtime.old;
//  3. the snapshot's layer is copied to runtime (Runtime.CopyState is
//     atomic and durable: after a crash runtime is missing or whole);
//  4. the branch is reset to the snapshot, rollback.json removed
//     durably, runtime.old deleted.
//
// So with rollback.json present, runtime.old present means step 2 was
// done, and runtime present beside it means step 3 was: recovery then
// finishes the rollback (step 4 can be done again); otherwise it puts
// the old layer back, and the rollback did not happen. Without
// rollback.json, a runtime.old left is deleted (step 4 was under way).

// rollbackMark is rollback.json: the rollback under way.
type rollbackMark struct {
	Snapshot string `json:"snapshot"` // the snapshot's id
	FS       string `json:"fs"`       // its project snapshot (cowfs)
}

func (m *Manager) rollbackFile(name string) string {
	return filepath.Join(m.dir(name), "rollback.json")
}
func (m *Manager) oldRtDir(name string) string { return m.rtDir(name) + ".old" }

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
	if err := m.stop(ctx, name, killCause{proto.KilledStopped, "the sandbox was stopped to roll it back"}); err != nil {
		return err
	}
	mark := rollbackMark{Snapshot: s.ID, FS: s.FS}
	if err := m.beginRollback(name, mark); err != nil {
		return fmt.Errorf("rollback sandbox %q: %w", name, err)
	}
	if err := rt.CopyState(ctx, filepath.Join(m.snapDir(s.ID), "runtime"), m.rtDir(name)); err != nil {
		return errors.Join(fmt.Errorf("rollback sandbox %q: %w", name, err), m.undoRollback(name))
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

// beginRollback does steps 1 and 2 of a rollback (see above). The
// sandbox is stopped.
func (m *Manager) beginRollback(name string, mark rollbackMark) error {
	old := m.oldRtDir(name)
	if _, err := os.Lstat(m.rtDir(name)); errors.Is(err, os.ErrNotExist) {
		// A layer an undo could not put back is the sandbox's: back first.
		if err := os.Rename(old, m.rtDir(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if err := writeJSON(m.rollbackFile(name), mark); err != nil {
		return err
	}
	if err := os.Rename(m.rtDir(name), old); err != nil {
		return errors.Join(err, m.undoRollback(name))
	}
	return nil
}

// undoRollback puts back the OS layer of a rollback that did not get to
// copy the snapshot's, and removes its rollback.json.
func (m *Manager) undoRollback(name string) error {
	if _, err := os.Lstat(m.rtDir(name)); errors.Is(err, os.ErrNotExist) {
		if err := os.Rename(m.oldRtDir(name), m.rtDir(name)); err != nil {
			return fmt.Errorf("put the OS layer back: %w", err)
		}
	}
	return m.dropRollbackFile(name)
}

// finishRollback does step 4 of a rollback (see above).
func (m *Manager) finishRollback(ctx context.Context, info *Info, mark rollbackMark) error {
	snap, err := m.fs.Resolve(ctx, mark.FS)
	if err != nil {
		return err
	}
	if err := m.fs.Rollback(ctx, info.Branch, snap); err != nil {
		return err
	}
	if err := m.dropRollbackFile(info.Name); err != nil {
		return err
	}
	if err := os.RemoveAll(m.oldRtDir(info.Name)); err != nil {
		return err
	}
	m.sweep()
	return nil
}

// dropRollbackFile removes rollback.json durably: one found again after
// later writes would roll them back.
func (m *Manager) dropRollbackFile(name string) error {
	if err := os.Remove(m.rollbackFile(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return atomicfile.SyncDir(m.dir(name))
}

// recoverRollback finishes or undoes the rollback of sandbox info that a
// crash interrupted (see above) and says which ("" when there was none).
func (m *Manager) recoverRollback(ctx context.Context, info *Info) (string, error) {
	var mark rollbackMark
	err := readJSON(m.rollbackFile(info.Name), &mark)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("interrupted rollback: %w", err)
	}
	_, rerr := os.Lstat(m.rtDir(info.Name))
	_, oerr := os.Lstat(m.oldRtDir(info.Name))
	if rerr == nil && oerr == nil {
		if err := m.finishRollback(ctx, info, mark); err != nil {
			return "", fmt.Errorf("finish an interrupted rollback: %w", err)
		}
		return fmt.Sprintf("sandbox %q: finished its rollback to %s, which a crash had interrupted", info.Name, mark.Snapshot), nil
	}
	if rerr != nil && oerr != nil {
		return "", fmt.Errorf("an interrupted rollback left no OS layer (runtime or runtime.old)")
	}
	if err := m.undoRollback(info.Name); err != nil {
		return "", fmt.Errorf("undo an interrupted rollback: %w", err)
	}
	return fmt.Sprintf("sandbox %q: a crash interrupted its rollback to %s before the snapshot's OS layer was copied; it was undone", info.Name, mark.Snapshot), nil
}
