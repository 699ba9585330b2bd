package chunkstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Refs live in the ref log (reflog.go). Stores of format 1 kept one file
// per ref under refs/; Open moves those into the log once.

// RefUpdate is one compare-and-swap change for UpdateRefs: ref Name moves
// from Old to New. A zero Old means the ref must not exist; a zero New
// deletes it.
type RefUpdate struct {
	Name     string
	Old, New ID
}

// loadRefs reads the refs: from the ref log, or from a format 1 store's
// ref files, which are then moved into a new log.
func (s *Store) loadRefs() error {
	s.refPrefixes = map[string]int{}
	ok, err := s.loadRefLog()
	if err != nil {
		return err
	}
	oldDir := filepath.Join(s.dir, "refs")
	if ok {
		// Ref files next to a log are left over from a move into it that
		// a crash cut short: the log is the truth.
		if !s.opts.AllowDamaged {
			if _, err := os.Stat(oldDir); err == nil {
				if err := os.RemoveAll(oldDir); err != nil {
					return fmt.Errorf("chunkstore: remove moved ref files %s: %w", oldDir, err)
				}
				if err := syncDir(s.dir); err != nil {
					return err
				}
			}
			if err := s.writeMarker(); err != nil {
				return err
			}
		}
		return nil
	}
	if _, err := os.Stat(oldDir); err != nil {
		err := fmt.Errorf("chunkstore: open %s: ref log %s is missing (run tine store recover %s): %w", s.dir, s.refLogPath(), s.dir, ErrCorrupt)
		if !s.opts.AllowDamaged && !s.opts.repair {
			return err
		}
		s.damage = append(s.damage, Damage{File: s.refLogPath(), Offset: -1, Problem: err.Error()})
		return nil
	}
	if err := s.loadRefFiles(oldDir); err != nil {
		return err
	}
	if s.opts.AllowDamaged {
		return nil // moved into a log by the first update
	}
	// Log first, then the marker, then the old files go.
	if err := s.rewriteRefLogLocked(); err != nil {
		return err
	}
	if err := s.writeMarker(); err != nil {
		return err
	}
	if err := os.RemoveAll(oldDir); err != nil {
		return fmt.Errorf("chunkstore: remove moved ref files %s: %w", oldDir, err)
	}
	return syncDir(s.dir)
}

// writeMarker writes the current format marker if the store has an older one.
func (s *Store) writeMarker() error {
	path := filepath.Join(s.dir, markerName)
	if b, err := os.ReadFile(path); err == nil && string(b) == markerText {
		return nil
	}
	return writeFileAtomic(path, []byte(markerText))
}

// loadRefFiles reads the ref files of a format 1 store (one file per ref
// under root, the path being the name).
func (s *Store) loadRefFiles(root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("chunkstore: read refs of %s: %w", s.dir, err)
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		name := filepath.ToSlash(rel)
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("chunkstore: read ref %s: %w", path, err)
		}
		id, err := decodeRef(name, path, b)
		if err == nil {
			err = validRefName(name)
		}
		if err != nil {
			if !s.opts.AllowDamaged {
				return fmt.Errorf("chunkstore: open %s: %w", s.dir, err)
			}
			s.damage = append(s.damage, Damage{File: path, Problem: err.Error()})
			return nil
		}
		s.applyRefOp(refOp{name: name, id: id})
		return nil
	})
}

// GetRef returns the id ref name points at, or ErrNotFound.
func (s *Store) GetRef(name string) (ID, error) {
	if err := validRefName(name); err != nil {
		return ID{}, err
	}
	s.mu.RLock()
	id, ok := s.refs[name]
	s.mu.RUnlock()
	if !ok {
		return ID{}, fmt.Errorf("chunkstore: ref %s in %s: %w", name, s.dir, ErrNotFound)
	}
	return id, nil
}

// SetRef points ref name at new if it currently points at old (a zero old
// means the ref must not exist); otherwise it fails with ErrConflict. It
// makes the objects put since the last flush durable with it, so that the
// ref never names an object that is not durable, and returns once the ref
// is durable. new must be in the store.
func (s *Store) SetRef(name string, old, new ID) error {
	if new.IsZero() {
		return fmt.Errorf("chunkstore: set ref %s: zero id (use DeleteRef)", name)
	}
	return s.UpdateRefs(RefUpdate{Name: name, Old: old, New: new})
}

// DeleteRef removes ref name if it points at old; otherwise it fails with
// ErrConflict. If the ref does not exist, the error wraps both ErrNotFound
// and ErrConflict. It returns once the removal is durable.
func (s *Store) DeleteRef(name string, old ID) error {
	return s.UpdateRefs(RefUpdate{Name: name, Old: old})
}

// UpdateRefs applies several compare-and-swap ref changes together: all or
// none. Each ref must point at its Old (zero: be absent), or UpdateRefs
// fails with ErrConflict naming the first ref that does not (wrapping
// ErrNotFound too for a delete of an absent ref). The changes and the
// objects put since the last flush (up to 1 MiB of them; more are flushed
// to packs and an index file first) cost one record appended to the ref
// log and one fdatasync; deferred changes made before (UpdateRefsDeferred)
// go first in that record. Every New must be in the store. A ref cannot be
// both a name and a '/'-prefix of other refs.
func (s *Store) UpdateRefs(updates ...RefUpdate) error {
	return s.updateRefs(true, updates)
}

// UpdateRefsDeferred applies the changes as UpdateRefs does, at once and
// for every reader of this Store, but writes nothing: they are written,
// and durable, with the next update that is (UpdateRefs, SetRef,
// DeleteRef), Flush or Close. A crash before that loses them all, in the
// order they were made (a later one is never kept without an earlier
// one). For changes that lose nothing when lost, such as a new ref to a
// tree another ref keeps.
func (s *Store) UpdateRefsDeferred(updates ...RefUpdate) error {
	return s.updateRefs(false, updates)
}

func (s *Store) updateRefs(durable bool, updates []RefUpdate) error {
	seen := make(map[string]bool, len(updates))
	for _, u := range updates {
		if err := validRefName(u.Name); err != nil {
			return err
		}
		if seen[u.Name] {
			return fmt.Errorf("chunkstore: update refs: ref %s named twice", u.Name)
		}
		seen[u.Name] = true
	}
	if len(updates) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("chunkstore: update ref %s: store %s is closed", updates[0].Name, s.dir)
	}
	for _, u := range updates {
		cur, ok := s.refs[u.Name]
		if u.New.IsZero() {
			if !ok {
				return fmt.Errorf("chunkstore: delete ref %s: %w (%w)", u.Name, ErrNotFound, ErrConflict)
			}
		} else if _, ok := s.index[u.New]; !ok {
			return fmt.Errorf("chunkstore: set ref %s to %s: object %w in %s", u.Name, u.New, ErrNotFound, s.dir)
		}
		if cur != u.Old {
			return fmt.Errorf("chunkstore: update ref %s: expected %s, found %s: %w", u.Name, short(u.Old), short(cur), ErrConflict)
		}
	}
	ops := make([]refOp, len(updates))
	undo := make([]refOp, len(updates))
	for i, u := range updates {
		ops[i] = refOp{name: u.Name, id: u.New}
		undo[len(updates)-1-i] = refOp{name: u.Name, id: u.Old}
		s.applyRefOp(ops[i])
	}
	rollback := func() {
		for _, op := range undo {
			s.applyRefOp(op)
		}
	}
	for _, op := range ops {
		if err := s.refNameClashLocked(op); err != nil {
			rollback()
			return err
		}
	}
	if !durable {
		s.deferred = append(s.deferred, ops...)
	} else if err := s.commitLocked(ops); err != nil {
		// The pending objects go into the same record, so that a ref
		// never names an object that is not durable.
		rollback()
		return err
	}
	for _, op := range ops {
		if !op.id.IsZero() {
			s.touch(op.id)
		}
	}
	return nil
}

// refNameClashLocked fails if a ref set by op is also a '/'-prefix of
// another ref, or has a ref as one of its own prefixes.
func (s *Store) refNameClashLocked(op refOp) error {
	if op.id.IsZero() {
		return nil
	}
	if s.refPrefixes[op.name] > 0 {
		return fmt.Errorf("chunkstore: set ref %s: other refs in %s are named %s/...", op.name, s.dir, op.name)
	}
	for i := len(op.name) - 1; i > 0; i-- {
		if op.name[i] == '/' {
			if _, ok := s.refs[op.name[:i]]; ok {
				return fmt.Errorf("chunkstore: set ref %s: ref %s in %s is in the way", op.name, op.name[:i], s.dir)
			}
		}
	}
	return nil
}

// ListRefs returns the refs whose names start with prefix.
func (s *Store) ListRefs(prefix string) (map[string]ID, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m := map[string]ID{}
	for n, id := range s.refs {
		if strings.HasPrefix(n, prefix) {
			m[n] = id
		}
	}
	return m, nil
}

func short(id ID) string {
	if id.IsZero() {
		return "(none)"
	}
	return id.String()[:12]
}

func fdatasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
