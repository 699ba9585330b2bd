package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"tine/cowfs"
)

// recover cleans up what a process that died mid-operation left under the
// state root, and records each thing it did (Recovered lists them):
//   - a sandbox's processes and cgroups still on the host (the process
//     died without stopping it, maybe while it was frozen for a
//     snapshot): ended and removed by the runtime, when it is a Reclaimer;
//   - a sandbox directory without sandbox.json (Create or Fork
//     interrupted before the sandbox existed): its branch and directory
//     are deleted;
//   - a rollback interrupted (its rollback.json left): finished when the
//     snapshot's OS layer was wholly copied, undone otherwise
//     (rollback.go);
//   - runtime.old beside a sandbox's runtime directory without
//     rollback.json (a rollback interrupted in its cleanup, or one of an
//     earlier tine): put back when the runtime directory is missing,
//     deleted otherwise;
//   - a sandbox whose branch is missing (made deferred by Create or Fork,
//     and lost by a crash before any commit of the store): made again
//     from the sandbox's origin snapshot, which is all it held;
//   - a snapshot directory without snapshot.json (Snapshot interrupted):
//     deleted;
//   - temporary files and directories (".tmp-" names: metadata, and
//     copies of OS layers): deleted.
//
// Entries whose names could not be tine's are left alone and reported. So
// is what could not be cleaned up, or read: one sandbox's problem keeps
// neither the root from opening nor the others from running (a rollback
// left unfinished keeps its sandbox from starting, see Start).
func (m *Manager) recover(ctx context.Context) error {
	did := func(format string, args ...any) {
		m.ext.recovered = append(m.ext.recovered, fmt.Sprintf(format, args...))
	}
	failed := func(err error) { did("%v; left as it is", err) }
	ents, err := os.ReadDir(filepath.Join(m.root, "sandboxes"))
	if err != nil {
		return fmt.Errorf("sandbox manager: %w", err)
	}
sandboxes:
	for _, e := range ents {
		name := e.Name()
		dir := m.dir(name)
		if !nameRE().MatchString(name) || !e.IsDir() {
			did("left %s alone: not a sandbox", dir)
			continue
		}
		removeTemps(dir)
		for _, rt := range m.rts {
			rc, ok := rt.(Reclaimer)
			if !ok {
				continue
			}
			found, err := rc.Reclaim(ctx, m.instanceID(name))
			if err != nil {
				failed(fmt.Errorf("sandbox %q: %w", name, err))
				continue sandboxes
			}
			if found != "" {
				did("sandbox %q: its processes outlived the process that ran it: %s", name, found)
			}
		}
		if _, err := os.Lstat(filepath.Join(dir, "sandbox.json")); errors.Is(err, os.ErrNotExist) {
			if err := m.fs.DeleteBranch(ctx, branchName(name)); err != nil && !errors.Is(err, cowfs.ErrNoBranch) {
				failed(fmt.Errorf("half-made sandbox %q: delete its branch: %w", name, err))
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				failed(fmt.Errorf("half-made sandbox %q: %w", name, err))
				continue
			}
			did("removed half-made sandbox %q (no sandbox.json: its creation was interrupted)", name)
			continue
		}
		if info, err := m.Get(name); err != nil {
			did("sandbox %q: its metadata cannot be read: %v", name, err)
		} else if remade, err := m.remakeBranch(ctx, info); err != nil {
			// The others still open: this one is reported and can be removed.
			did("sandbox %q: its branch is missing and was not made again (%v); it cannot start: remove it", name, err)
		} else {
			if remade {
				did("sandbox %q: its branch, made just before a crash and never committed, was lost; made it again from its origin snapshot", name)
			}
			if what, err := m.recoverRollback(ctx, info); err != nil {
				failed(fmt.Errorf("sandbox %q: %w", name, err))
				continue
			} else if what != "" {
				did("%s", what)
			}
		}
		old := m.rtDir(name) + ".old"
		if _, err := os.Lstat(old); err == nil {
			if _, err := os.Lstat(m.rtDir(name)); errors.Is(err, os.ErrNotExist) {
				if err := os.Rename(old, m.rtDir(name)); err != nil {
					failed(fmt.Errorf("sandbox %q: put back its OS layer after an interrupted rollback: %w", name, err))
					continue
				}
				did("sandbox %q: an interrupted rollback had moved its OS layer aside; put it back", name)
			} else {
				if err := os.RemoveAll(old); err != nil {
					failed(fmt.Errorf("sandbox %q: remove the layer an interrupted rollback left: %w", name, err))
					continue
				}
				did("sandbox %q: removed the old OS layer an interrupted rollback left", name)
			}
		}
	}
	snaps, err := os.ReadDir(filepath.Join(m.root, "snapshots"))
	if err != nil {
		return fmt.Errorf("sandbox manager: %w", err)
	}
	for _, e := range snaps {
		dir := m.snapDir(e.Name())
		if !nameRE().MatchString(e.Name()) || !e.IsDir() {
			did("left %s alone: not a snapshot", dir)
			continue
		}
		removeTemps(dir)
		if _, err := os.Lstat(filepath.Join(dir, "snapshot.json")); errors.Is(err, os.ErrNotExist) {
			if err := os.RemoveAll(dir); err != nil {
				failed(fmt.Errorf("half-made snapshot %s: %w", e.Name(), err))
				continue
			}
			did("removed half-made snapshot %s (no snapshot.json: it was interrupted)", e.Name())
		} else if _, err := m.GetSnapshot(e.Name()); errors.Is(err, ErrDamaged) {
			did("snapshot %s: %v; it is left out of every list, and its files are kept", e.Name(), err)
		}
	}
	return nil
}

// remakeBranch makes the sandbox's branch again from its origin snapshot,
// with its quota, when the branch is missing.
func (m *Manager) remakeBranch(ctx context.Context, info *Info) (bool, error) {
	if _, err := m.fs.Head(ctx, info.Branch); !errors.Is(err, cowfs.ErrNoBranch) {
		return false, err
	}
	snap, err := m.fs.Resolve(ctx, info.Origin)
	if err != nil {
		return false, fmt.Errorf("make its lost branch again: origin %q: %w", info.Origin, err)
	}
	if err := m.fs.Branch(ctx, snap, info.Branch); err != nil {
		return false, fmt.Errorf("make its lost branch again: %w", err)
	}
	if info.Limits.ProjectBytes > 0 {
		if err := m.fs.SetQuota(ctx, info.Branch, info.Limits.ProjectBytes); err != nil {
			return false, fmt.Errorf("make its lost branch again: %w", err)
		}
	}
	return true, nil
}

// Reclaimer is a Runtime that can end what an instance left on the host
// when the process that started it died without stopping it.
type Reclaimer interface {
	// Reclaim ends the processes and releases the host resources of the
	// instance that was started with Spec.ID id, if any are left. It says
	// what it found, or "" when there was nothing.
	Reclaim(ctx context.Context, id string) (string, error)
}

// instanceID is the Spec.ID of sandbox name: unique on the host, since
// m.id differs between state roots.
func (m *Manager) instanceID(name string) string { return "tine-" + m.id + "-" + name }

// removeTemps deletes what writeJSON and Runtime.CopyState leave when
// interrupted: files and directories whose names start with ".tmp-".
func removeTemps(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// Recovered lists what Open found left by an interrupted operation and
// cleaned up, one sentence each.
func (m *Manager) Recovered() []string {
	return append([]string(nil), m.ext.recovered...)
}
