package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Damage names one damaged or missing object, or a damaged file.
type Damage struct {
	ID      ID     // zero for damage to a whole file (index, ref)
	File    string // pack, index or ref file
	Offset  int64  // offset of the object's record or the damage in File; -1 if unknown
	Problem string
	// Repaired is set for damage nothing was lost to: a ref log record
	// or header read from its copy. Opening the store without
	// AllowDamaged rewrites the log.
	Repaired bool
}

func (d Damage) String() string {
	if d.Repaired {
		return d.Problem + " (read from its copy; nothing lost)"
	}
	if d.ID.IsZero() {
		return fmt.Sprintf("%s: %s", d.File, d.Problem)
	}
	return fmt.Sprintf("object %s (%s offset %d): %s", d.ID, d.File, d.Offset, d.Problem)
}

// VerifyReport is the result of Verify.
type VerifyReport struct {
	Objects int64 // objects read and checked
	Bytes   int64 // uncompressed bytes checked
	Refs    int   // refs checked
	// Damaged lists every object that failed a check, every node link and
	// ref that names a missing object, and every file that failed to decode.
	Damaged []Damage
}

// OK reports whether Verify found nothing wrong.
func (r VerifyReport) OK() bool { return len(r.Damaged) == 0 }

// Verify reads every object, checks its record checksum, decompresses it
// and recomputes its SHA-256; it decodes every node and checks that its
// links and every ref name stored objects. The report names each damaged
// object with its pack file and offset. It waits for a running GC to end
// and keeps GC from starting until it is done. The returned error is only for
// Verify itself failing (for example ctx being cancelled).
func (s *Store) Verify(ctx context.Context) (VerifyReport, error) {
	var rep VerifyReport
	s.gcMu.Lock() // a concurrent sweep would make links look dangling
	defer s.gcMu.Unlock()
	s.mu.RLock()
	rep.Damaged = append(rep.Damaged, s.damage...)
	entries := make([]indexEntry, 0, len(s.index))
	for id, l := range s.index {
		entries = append(entries, indexEntry{id: id, loc: l})
	}
	refs := make(map[string]ID, len(s.refs))
	for n, id := range s.refs {
		refs[n] = id
	}
	for n := range s.packs {
		hdr := make([]byte, packHeaderLen)
		name := s.packPath(n)
		if err := s.readAtLocked(n, 0, hdr); err != nil {
			rep.Damaged = append(rep.Damaged, Damage{File: name, Problem: fmt.Sprintf("offset 0: read header: %v", err)})
		} else if num, err := decodePackHeader(name, hdr); err != nil {
			rep.Damaged = append(rep.Damaged, Damage{File: name, Problem: err.Error()})
		} else if num != n {
			rep.Damaged = append(rep.Damaged, Damage{File: name, Problem: fmt.Sprintf("offset 12: header names pack %d", num)})
		}
	}
	s.mu.RUnlock()
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i].loc, entries[j].loc
		if a.pack != b.pack {
			return a.pack < b.pack
		}
		return a.off < b.off
	})

	var mu sync.Mutex
	report := func(d Damage) {
		mu.Lock()
		rep.Damaged = append(rep.Damaged, d)
		mu.Unlock()
	}
	jobs := make(chan indexEntry, 64)
	var wg sync.WaitGroup
	var objects, bytes int64
	for range s.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range jobs {
				data, _, err := s.read(e.id)
				mu.Lock()
				objects++
				bytes += int64(e.loc.ulen)
				mu.Unlock()
				file := s.packPath(e.loc.pack)
				if err != nil {
					if errors.Is(err, ErrNotFound) {
						continue // removed by a concurrent GC
					}
					report(Damage{ID: e.id, File: file, Offset: e.loc.off, Problem: err.Error()})
					continue
				}
				if e.loc.kind != kindNode {
					continue
				}
				links, _, err := decodeNode(e.id, data)
				if err != nil {
					report(Damage{ID: e.id, File: file, Offset: e.loc.off, Problem: err.Error()})
					continue
				}
				for _, link := range links {
					if !link.IsZero() && !s.present(link) {
						report(Damage{ID: e.id, File: file, Offset: e.loc.off, Problem: fmt.Sprintf("links to missing object %s", link)})
					}
				}
			}
		}()
	}
	var err error
	for _, e := range entries {
		if err = ctx.Err(); err != nil {
			break
		}
		jobs <- e
	}
	close(jobs)
	wg.Wait()
	rep.Objects, rep.Bytes = objects, bytes
	for name, id := range refs {
		rep.Refs++
		if !s.present(id) {
			report(Damage{File: s.refLogPath(), Offset: -1, Problem: fmt.Sprintf("ref %s names missing object %s", name, id)})
		}
	}
	sort.Slice(rep.Damaged, func(i, j int) bool {
		a, b := rep.Damaged[i], rep.Damaged[j]
		if a.File != b.File {
			return a.File < b.File
		}
		return a.Offset < b.Offset
	})
	return rep, err
}

// present reports whether id is stored, without marking it as recently used.
func (s *Store) present(id ID) bool {
	s.mu.RLock()
	_, ok := s.index[id]
	s.mu.RUnlock()
	return ok
}
