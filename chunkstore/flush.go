package chunkstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Flush makes every object put so far durable in packs and index files,
// and the deferred ref changes durable in the ref log:
// the packs are fsync'd, then a new index file naming the objects put (or
// journaled in the ref log) since the last one is written, fsync'd and
// renamed into place, and the directories are fsync'd; the ref log is
// rewritten without the objects it journaled. Ref updates do not need it:
// they make the pending objects durable themselves, more cheaply.
func (s *Store) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("chunkstore: flush %s: store is closed", s.dir)
	}
	if err := s.checkpointLocked(false); err != nil {
		return err
	}
	if len(s.deferred) > 0 {
		return s.commitLocked(nil)
	}
	return nil
}

// checkpointLocked fsyncs the packs and writes an index file naming the
// objects put or journaled since the last one, then rewrites the ref log
// without objects (always with rewriteLog).
func (s *Store) checkpointLocked(rewriteLog bool) error {
	if len(s.pending) > 0 || len(s.journaled) > 0 || s.logicalPending > 0 {
		if err := s.syncPacksLocked(); err != nil {
			return err
		}
		entries := append(s.journaled[:len(s.journaled):len(s.journaled)], s.pending...)
		if err := s.writeIndexLocked(entries, s.logicalPending, false); err != nil {
			return err
		}
		s.deltaSize += len(entries)
		s.logicalDurable += s.logicalPending
		s.logicalPending = 0
		s.pending = s.pending[:0]
		s.journaled = nil
		// Replace the index files by one whole-store index when they are
		// many and together large next to the index, so that open stays
		// quick without rewriting a big index on every checkpoint.
		if n := len(s.idxFiles); n > 1024 || n > 64 && s.deltaSize > len(s.index)/8 {
			if err := s.rewriteIndexLocked(); err != nil {
				return err
			}
		}
	}
	if rewriteLog || s.logObjects {
		return s.rewriteRefLogLocked()
	}
	return nil
}

// syncPacksLocked writes out and fsyncs the open pack and the sealed packs
// not yet synced, then the packs directory.
func (s *Store) syncPacksLocked() error {
	if s.w != nil {
		s.handOffLocked()
		s.dirty = append(s.dirty, s.w.f)
	}
	if err := s.fl.drain(); err != nil {
		return err
	}
	if len(s.dirty) == 0 {
		return nil
	}
	for _, f := range s.dirty {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("chunkstore: fsync pack %s: %w", f.Name(), err)
		}
	}
	s.dirty = s.dirty[:0]
	if !s.newPacks {
		return nil // every pack file's name is durable already
	}
	if err := syncDir(filepath.Join(s.dir, "packs")); err != nil {
		return err
	}
	s.newPacks = false
	return nil
}

// writeIndexLocked writes one index file holding entries.
func (s *Store) writeIndexLocked(entries []indexEntry, logical uint64, full bool) error {
	n := s.nextIdx
	path := filepath.Join(s.dir, "index", indexName(n))
	if err := writeFileAtomic(path, encodeIndex(entries, logical, full)); err != nil {
		return err
	}
	s.nextIdx++
	s.idxFiles = append(s.idxFiles, n)
	return nil
}

// rewriteIndexLocked replaces all index files by one holding the whole
// index. The new file is durable before the old ones are removed, so a
// crash leaves either or both, and both describe the same objects.
func (s *Store) rewriteIndexLocked() error {
	if err := s.syncPacksLocked(); err != nil {
		return err
	}
	entries := make([]indexEntry, 0, len(s.index))
	for id, l := range s.index {
		entries = append(entries, indexEntry{id: id, loc: l})
	}
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i].loc, entries[j].loc
		if a.pack != b.pack {
			return a.pack < b.pack
		}
		return a.off < b.off
	})
	old := s.idxFiles
	s.idxFiles = nil
	if err := s.writeIndexLocked(entries, s.logicalDurable+s.logicalPending, true); err != nil {
		s.idxFiles = append(old, s.idxFiles...)
		return err
	}
	s.logicalDurable += s.logicalPending
	s.logicalPending = 0
	s.pending = s.pending[:0]
	s.journaled = nil
	s.deltaSize = 0
	if s.logObjects {
		// The whole index names the journaled objects now; GC may remove
		// packs next, so the log must not bring old places back.
		if err := s.rewriteRefLogLocked(); err != nil {
			return err
		}
	}
	idxDir := filepath.Join(s.dir, "index")
	for _, n := range old {
		if err := os.Remove(filepath.Join(idxDir, indexName(n))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("chunkstore: remove old index: %w", err)
		}
	}
	return syncDir(idxDir)
}

// writeFileAtomic writes path through a temporary file that is fsync'd
// and renamed into place; the directory is fsync'd after.
func writeFileAtomic(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("chunkstore: create %s: %w", tmp, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("chunkstore: write %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("chunkstore: fsync directory %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("chunkstore: fsync directory %s: %w", dir, err)
	}
	return nil
}
