package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// GCStats reports what a GC did.
type GCStats struct {
	Live            int64 // objects found reachable
	Missing         int64 // reachable objects the store does not hold
	Deleted         int64 // objects removed
	DeletedBytes    int64 // pack bytes those objects took
	PacksDeleted    int   // packs removed because nothing in them was live
	PacksRepacked   int   // packs whose live objects were copied and which were then removed
	RepackedObjects int64 // objects copied by repacking
	Duration        time.Duration
}

// repackDeadFraction is the share of dead bytes above which a pack is
// rewritten; packs under smallPackFraction of PackSize are merged.
const (
	repackDeadFraction = 0.10
	smallPackFraction  = 0.25
)

// GC removes objects that are not reachable from the refs or extraRoots,
// following node links. It marks without blocking puts and reads. Objects
// put, or found already stored by Put, PutNode or Has, within
// Options.GCGrace before the GC began or while it runs are kept too, with
// everything their links reach: that leaves callers time to link new
// objects from a node or a ref. Then,
// with the store locked, it removes dead objects: packs with nothing live
// are deleted, packs with more than 10% dead bytes and small packs are
// rewritten. The new index is durable before any old index file or pack is
// removed.
//
// Dead objects leave the index at once; their bytes stay in a pack until
// it is rewritten or deleted.
//
// An id held only in memory for longer than that (not in a ref, not
// linked from a kept node) is not protected: pass it in extraRoots.
func (s *Store) GC(ctx context.Context, extraRoots ...ID) (GCStats, error) {
	start := time.Now()
	var st GCStats
	s.gcMu.Lock()
	defer s.gcMu.Unlock()

	// Phase 1: make everything durable, seal the open pack and note the
	// first pack number that new puts will use; start recording touches.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return st, fmt.Errorf("chunkstore: gc %s: store is closed", s.dir)
	}
	if err := s.unreadableLocked(); err != nil {
		s.mu.Unlock()
		return st, fmt.Errorf("chunkstore: gc %s: refusing to delete anything: %w", s.dir, err)
	}
	err := s.sealLocked()
	if err == nil {
		err = s.checkpointLocked(false)
	}
	if err == nil {
		err = s.syncPacksLocked()
	}
	if err != nil {
		s.mu.Unlock()
		return st, err
	}
	boundary := s.nextPack
	roots := append([]ID(nil), extraRoots...)
	for _, id := range s.refs {
		roots = append(roots, id)
	}
	s.touchMu.Lock()
	began := time.Since(s.opened)
	for id, t := range s.touched {
		if t >= began-s.opts.GCGrace {
			roots = append(roots, id)
		} else {
			delete(s.touched, id)
		}
	}
	s.touchMu.Unlock()
	s.mu.Unlock()

	// Phase 2: mark, concurrently with puts.
	live := map[ID]struct{}{}
	getLinks := func(id ID) ([]ID, bool, error) {
		s.mu.RLock()
		l, ok := s.index[id]
		s.mu.RUnlock()
		if !ok {
			return nil, false, nil
		}
		if l.kind != kindNode {
			return nil, true, nil
		}
		links, _, err := s.GetNode(id)
		return links, true, err
	}
	if err := s.mark(ctx, roots, live, &st, getLinks); err != nil {
		return st, err
	}

	// Phase 3: with the store locked, mark from the refs as they are now
	// and from everything touched during phase 2, then sweep.
	s.mu.Lock()
	defer s.mu.Unlock()
	roots = roots[:0]
	for _, id := range s.refs {
		roots = append(roots, id)
	}
	s.touchMu.Lock()
	for id, t := range s.touched {
		if t >= began {
			roots = append(roots, id)
		}
	}
	s.touchMu.Unlock()
	getLinksLocked := func(id ID) ([]ID, bool, error) {
		l, ok := s.index[id]
		if !ok {
			return nil, false, nil
		}
		if l.kind != kindNode {
			return nil, true, nil
		}
		raw, l, err := s.readRawLocked(id)
		if err != nil {
			return nil, true, err
		}
		data, err := s.decode(id, l, raw)
		if err != nil {
			return nil, true, err
		}
		links, _, err := decodeNode(id, data)
		return links, true, err
	}
	if err := s.mark(ctx, roots, live, &st, getLinksLocked); err != nil {
		return st, err
	}
	return st, s.sweepLocked(boundary, live, &st, start)
}

// unreadableLocked returns an error naming the first ref log record, ref
// or index file that could not be read in full, or nil. What it names may
// hold the only reference to objects GC would otherwise delete.
func (s *Store) unreadableLocked() error {
	for _, d := range s.damage {
		if !d.Repaired && d.ID.IsZero() {
			return fmt.Errorf("%s is unreadable (run tine store recover %s): %w", d, s.dir, ErrCorrupt)
		}
	}
	if s.refLogErr != nil {
		return fmt.Errorf("ref log %s: %w", s.refLogPath(), s.refLogErr)
	}
	return nil
}

// mark adds to live everything reachable from roots.
func (s *Store) mark(ctx context.Context, roots []ID, live map[ID]struct{}, st *GCStats, getLinks func(ID) ([]ID, bool, error)) error {
	stack := append([]ID(nil), roots...)
	for n := 0; len(stack) > 0; n++ {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("chunkstore: gc %s: %w", s.dir, err)
			}
		}
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if id.IsZero() {
			continue
		}
		if _, ok := live[id]; ok {
			continue
		}
		live[id] = struct{}{}
		links, ok, err := getLinks(id)
		if err != nil {
			return fmt.Errorf("chunkstore: gc %s: cannot read node %s, stopping so as not to lose what it links to: %w", s.dir, id, err)
		}
		if !ok {
			st.Missing++
			continue
		}
		st.Live++
		stack = append(stack, links...)
	}
	return nil
}

type packUsage struct {
	size      int64 // pack file size
	liveBytes int64
	live      int64
	liveIDs   []ID
}

// sweepLocked removes dead objects in packs numbered below boundary from
// the index, and deletes or rewrites the packs that hold them.
func (s *Store) sweepLocked(boundary uint32, live map[ID]struct{}, st *GCStats, start time.Time) error {
	usage := map[uint32]*packUsage{}
	for n, f := range s.packs {
		if n >= boundary {
			continue
		}
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("chunkstore: gc: stat pack %s: %w", s.packPath(n), err)
		}
		usage[n] = &packUsage{size: fi.Size()}
	}
	for id, l := range s.index {
		u := usage[l.pack]
		if l.pack >= boundary || u == nil {
			continue
		}
		n := recHeaderLen + int64(l.clen)
		if _, ok := live[id]; ok {
			u.liveBytes += n
			u.live++
			u.liveIDs = append(u.liveIDs, id)
			continue
		}
		// Dead: out of the index now; its bytes go when the pack does.
		delete(s.index, id)
		s.cache.drop(id)
		st.Deleted++
		st.DeletedBytes += n
	}
	nums := make([]uint32, 0, len(usage))
	small := 0
	for n, u := range usage {
		nums = append(nums, n)
		if u.live > 0 && float64(u.size) < smallPackFraction*float64(s.opts.PackSize) {
			small++
		}
	}
	sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
	var remove []uint32
	for _, n := range nums {
		u := usage[n]
		dead := u.size - packHeaderLen - u.liveBytes
		switch {
		case u.live == 0:
			st.PacksDeleted++
		case float64(dead) >= repackDeadFraction*float64(u.size),
			small > 1 && float64(u.size) < smallPackFraction*float64(s.opts.PackSize):
			if err := s.repackLocked(n, u.liveIDs); err != nil {
				return err
			}
			st.PacksRepacked++
			st.RepackedObjects += u.live
		default:
			continue // keep the pack; its dead bytes wait for a later GC
		}
		remove = append(remove, n)
	}
	if st.Deleted == 0 && len(remove) == 0 {
		st.Duration = time.Since(start)
		return nil
	}
	// New packs and the whole index are made durable before anything old
	// is removed.
	if err := s.sealLocked(); err != nil {
		return err
	}
	if err := s.rewriteIndexLocked(); err != nil {
		return err
	}
	packDir := filepath.Join(s.dir, "packs")
	for _, n := range remove {
		if f := s.packs[n]; f != nil {
			f.Close()
			delete(s.packs, n)
		}
		if err := os.Remove(filepath.Join(packDir, packName(n))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("chunkstore: gc: remove pack: %w", err)
		}
	}
	st.Duration = time.Since(start)
	return syncDir(packDir)
}

// repackLocked copies the live records of pack n, as stored, into the open
// pack. Each record's checksum is checked first: GC never copies damage.
func (s *Store) repackLocked(n uint32, ids []ID) error {
	sort.Slice(ids, func(i, j int) bool { return s.index[ids[i]].off < s.index[ids[j]].off })
	name := s.packPath(n)
	for _, id := range ids {
		raw, l, err := s.readRawLocked(id)
		if err != nil {
			return fmt.Errorf("chunkstore: gc: repack %s: %w", name, err)
		}
		h, stored, err := decodeRecord(name, l.off, raw)
		if err != nil {
			return fmt.Errorf("chunkstore: gc: repack %s: %w", name, err)
		}
		if h.id != id || h.kind != l.kind || h.ulen != l.ulen {
			return fmt.Errorf("chunkstore: gc: repack %s offset %d: record does not match the index entry for %s: %w", name, l.off, id, ErrCorrupt)
		}
		if err := s.appendLocked(h.kind, h.codec, h.ulen, id, stored); err != nil {
			return err
		}
	}
	return nil
}
