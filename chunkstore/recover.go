package chunkstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Progress is told how far a long repair has come: done of total units
// (bytes of packs, or nodes) in the named phase.
type Progress func(phase string, done, total int64)

// RebuildReport is the result of RebuildIndex.
type RebuildReport struct {
	Packs   int   // pack files scanned
	Objects int64 // objects found and indexed
	Index   string
	// Damaged lists bad pack headers and damaged records that valid ones
	// follow; their objects are not indexed.
	Damaged []Damage
	// Tails lists packs whose last bytes hold no valid record: appends a
	// crash cut short, or damage at the end of the pack.
	Tails []Damage
}

// RebuildIndex scans every record of every pack of the store in dir
// (checking each record's checksum, streaming) and writes one whole-store
// index file naming the valid ones, numbered after every index file there,
// so that it supersedes them, damaged ones included. It never deletes a
// pack or an index file. The logical byte count restarts at the bytes of
// the chunks found. dir must hold a store (see IsStore); it takes the
// store's lock.
func RebuildIndex(ctx context.Context, dir string, progress Progress) (RebuildReport, error) {
	var rep RebuildReport
	if err := needStore(dir); err != nil {
		return rep, err
	}
	lock, err := lockStore(dir)
	if err != nil {
		return rep, err
	}
	defer lock.Close()
	packDir, idxDir := filepath.Join(dir, "packs"), filepath.Join(dir, "index")
	ents, err := os.ReadDir(packDir)
	if err != nil {
		return rep, fmt.Errorf("chunkstore: rebuild index of %s: %w", dir, err)
	}
	type pack struct {
		num  uint32
		path string
		size int64
	}
	var packs []pack
	var total, done int64
	for _, e := range ents {
		n, ok := parseNum(e.Name(), ".pack", 8)
		if !ok {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return rep, fmt.Errorf("chunkstore: rebuild index of %s: %w", dir, err)
		}
		packs = append(packs, pack{uint32(n), filepath.Join(packDir, e.Name()), fi.Size()})
		total += fi.Size()
	}
	found := map[ID]loc{}
	var logical uint64
	for _, p := range packs {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("chunkstore: rebuild index of %s: %w", dir, err)
		}
		f, err := os.Open(p.path)
		if err != nil {
			return rep, fmt.Errorf("chunkstore: rebuild index: %w", err)
		}
		damage, end := scanPack(p.path, f, p.size, func(off int64, h recHeader) {
			if _, dup := found[h.id]; !dup && h.kind == kindBlob {
				logical += uint64(h.ulen)
			}
			found[h.id] = loc{pack: p.num, kind: h.kind, codec: h.codec, clen: h.clen, ulen: h.ulen, off: off}
		})
		f.Close()
		rep.Packs++
		rep.Damaged = append(rep.Damaged, damage...)
		if end < p.size {
			rep.Tails = append(rep.Tails, Damage{File: p.path, Offset: end, Problem: fmt.Sprintf("%d bytes after the last valid record", p.size-end)})
		}
		done += p.size
		if progress != nil {
			progress("scan packs", done, total)
		}
	}
	entries := make([]indexEntry, 0, len(found))
	for id, l := range found {
		entries = append(entries, indexEntry{id: id, loc: l})
	}
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i].loc, entries[j].loc
		if a.pack != b.pack {
			return a.pack < b.pack
		}
		return a.off < b.off
	})
	next := uint64(1)
	ents, err = os.ReadDir(idxDir)
	if err != nil {
		return rep, fmt.Errorf("chunkstore: rebuild index of %s: %w", dir, err)
	}
	for _, e := range ents {
		if n, ok := parseNum(e.Name(), ".idx", 16); ok && n >= next {
			next = n + 1
		}
	}
	rep.Index = filepath.Join(idxDir, indexName(next))
	rep.Objects = int64(len(entries))
	return rep, writeFileAtomic(rep.Index, encodeIndex(entries, logical, true))
}

// RecoverReport is the result of Recover.
type RecoverReport struct {
	// Rebuilt is set when the index had to be rebuilt first; Index is
	// that rebuild's report.
	Rebuilt bool
	Index   RebuildReport
	// Damaged lists the damage found in the ref log and index files; the
	// refs that could be read are kept, and a damaged log is saved as
	// refs.log.damaged before it is rewritten.
	Damaged []Damage
	Nodes   int64    // nodes read
	Roots   int      // nodes no other node links to
	Added   []string // refs added, recovered/<id>, one per root no ref named
	// Unreadable lists nodes that failed to read; what only they link to
	// may show up as roots.
	Unreadable []Damage
}

// Recover brings back what damage to the refs or the index lost. It
// rebuilds the index from the packs when an index file is damaged or a
// pack is missing, rewrites a damaged ref log from the refs that can be
// read, then finds every root (a node no other node links to) and, for
// each that no ref names, sets recovered/<id>. Existing refs are left as
// they are, and running it again adds nothing. Roots of data deleted on
// purpose but not yet collected come back too, as with restic's recover:
// delete those refs again. dir must hold a store (see IsStore).
func Recover(ctx context.Context, dir string, progress Progress) (RecoverReport, error) {
	var rep RecoverReport
	if err := needStore(dir); err != nil {
		return rep, err
	}
	s, err := Open(dir, &Options{AllowDamaged: true})
	if err != nil {
		return rep, err
	}
	idxBad := s.idxBad
	s.Close()
	if idxBad {
		rep.Rebuilt = true
		if rep.Index, err = RebuildIndex(ctx, dir, progress); err != nil {
			return rep, err
		}
	}
	s, err = Open(dir, &Options{repair: true})
	if err != nil {
		return rep, err
	}
	rep.Damaged = s.damage
	err = s.addRoots(ctx, &rep, progress)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	return rep, err
}

// addRoots sets recovered/<id> for every root no ref names.
func (s *Store) addRoots(ctx context.Context, rep *RecoverReport, progress Progress) error {
	s.mu.RLock()
	var nodes []ID
	for id, l := range s.index {
		if l.kind == kindNode {
			nodes = append(nodes, id)
		}
	}
	named := map[ID]bool{}
	for _, id := range s.refs {
		named[id] = true
	}
	s.mu.RUnlock()
	linked := map[ID]bool{}
	for i, id := range nodes {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("chunkstore: recover %s: %w", s.dir, err)
			}
			if progress != nil {
				progress("read nodes", int64(i), int64(len(nodes)))
			}
		}
		links, _, err := s.GetNode(id)
		if err != nil {
			s.mu.RLock()
			l := s.index[id]
			s.mu.RUnlock()
			rep.Unreadable = append(rep.Unreadable, Damage{ID: id, File: s.packPath(l.pack), Offset: l.off, Problem: err.Error()})
			continue
		}
		rep.Nodes++
		for _, link := range links {
			linked[link] = true
		}
	}
	if progress != nil {
		progress("read nodes", int64(len(nodes)), int64(len(nodes)))
	}
	var ups []RefUpdate
	for _, id := range nodes {
		if linked[id] {
			continue
		}
		rep.Roots++
		if named[id] {
			continue
		}
		ups = append(ups, RefUpdate{Name: "recovered/" + id.String(), New: id})
	}
	sort.Slice(ups, func(i, j int) bool { return ups[i].Name < ups[j].Name })
	if err := s.UpdateRefs(ups...); err != nil {
		return fmt.Errorf("chunkstore: recover %s: %w", s.dir, err)
	}
	for _, u := range ups {
		rep.Added = append(rep.Added, u.Name)
	}
	return nil
}

// needStore fails unless dir holds a store.
func needStore(dir string) error {
	ok, err := IsStore(dir)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("chunkstore: %s is not a tine store (no %s marker; nothing was created): %w", dir, markerName, ErrNotStore)
	}
	return nil
}
