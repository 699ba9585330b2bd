package chunkstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Refs live one per file under refs/, the file path being the ref name.

func (s *Store) refPath(name string) string {
	return filepath.Join(s.dir, "refs", filepath.FromSlash(name))
}

// loadRefs reads every ref file into memory and removes temporary files.
func (s *Store) loadRefs() error {
	root := filepath.Join(s.dir, "refs")
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("chunkstore: read refs of %s: %w", s.dir, err)
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		name := filepath.ToSlash(rel)
		if strings.HasPrefix(d.Name(), ".") {
			if !s.opts.AllowDamaged {
				os.Remove(path)
			}
			return nil
		}
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
		s.refs[name] = id
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
// flushes first, so that the ref never names an object that is not
// durable, and returns once the ref is durable. new must be in the store.
func (s *Store) SetRef(name string, old, new ID) error {
	if err := validRefName(name); err != nil {
		return err
	}
	if new.IsZero() {
		return fmt.Errorf("chunkstore: set ref %s: zero id (use DeleteRef)", name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("chunkstore: set ref %s: store %s is closed", name, s.dir)
	}
	if _, ok := s.index[new]; !ok {
		return fmt.Errorf("chunkstore: set ref %s to %s: object %w in %s", name, new, ErrNotFound, s.dir)
	}
	cur := s.refs[name]
	if cur != old {
		return fmt.Errorf("chunkstore: set ref %s: expected %s, found %s: %w", name, short(old), short(cur), ErrConflict)
	}
	if err := s.flushLocked(); err != nil {
		return err
	}
	path := s.refPath(name)
	if err := s.mkdirRefParents(path); err != nil {
		return err
	}
	if err := writeFileAtomic(path, encodeRef(name, new)); err != nil {
		return fmt.Errorf("chunkstore: set ref %s: %w", name, err)
	}
	s.refs[name] = new
	s.touch(new)
	return nil
}

// mkdirRefParents creates the directories of a ref file, fsyncing each new
// directory's parent, and fails if a ref occupies one of their names.
func (s *Store) mkdirRefParents(path string) error {
	root := filepath.Join(s.dir, "refs")
	var missing []string
	for d := filepath.Dir(path); d != root; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				return fmt.Errorf("chunkstore: ref file %s is in the way of %s", d, path)
			}
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("chunkstore: create ref directory %s: %w", missing[i], err)
		}
		if err := syncDir(filepath.Dir(missing[i])); err != nil {
			return err
		}
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("chunkstore: ref name %s is a directory of other refs (%s)", path, root)
	}
	return nil
}

// DeleteRef removes ref name if it points at old; otherwise it fails with
// ErrConflict. If the ref does not exist, the error wraps both ErrNotFound
// and ErrConflict. It returns once the removal is durable.
func (s *Store) DeleteRef(name string, old ID) error {
	if err := validRefName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("chunkstore: delete ref %s: store %s is closed", name, s.dir)
	}
	cur, ok := s.refs[name]
	if !ok {
		return fmt.Errorf("chunkstore: delete ref %s: %w (%w)", name, ErrNotFound, ErrConflict)
	}
	if cur != old {
		return fmt.Errorf("chunkstore: delete ref %s: expected %s, found %s: %w", name, short(old), short(cur), ErrConflict)
	}
	path := s.refPath(name)
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("chunkstore: delete ref %s: %w", name, err)
	}
	delete(s.refs, name)
	dir := filepath.Dir(path)
	root := filepath.Join(s.dir, "refs")
	for ; dir != root; dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return syncDir(dir)
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
