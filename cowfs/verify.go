package cowfs

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"tine/chunkstore"
)

// Problem is one fault Verify found in a tree.
type Problem struct {
	Ref  string        // a ref that reaches the object (cowfs/branch/NAME, cowfs/snap/ID...)
	Path string        // the entry's path in that tree ("/" for its top directory)
	ID   chunkstore.ID // the object at fault
	Err  error
}

func (p Problem) String() string {
	return fmt.Sprintf("%s: %s: object %s: %v", p.Ref, p.Path, p.ID, p.Err)
}

// VerifyStats counts what Verify looked at.
type VerifyStats struct {
	Trees    int // distinct root objects (snapshots and branch heads)
	Dirs     int // directory objects decoded
	Files    int // file objects decoded, leaves included
	Chunks   int // chunk links found present
	Problems int
}

// Verify decodes every tree the filesystem keeps: the tree of every
// snapshot, snapshot name, branch head and branch base. It decodes each
// directory and file object (leaves included), checks each entry against
// the limits, checks that file objects add up to their entry's size and
// that every linked object is in the store, and calls report for each
// fault with the ref, path and object id. Each object is decoded once,
// however many trees share it, and the walk keeps its own stack, so a tree
// of any depth is checked. It does not read chunk bytes: the store's own
// Verify checks those. The error is for a failure to run (a cancelled
// ctx, an unreadable ref log), not for problems found.
func (f *FS) Verify(ctx context.Context, report func(Problem)) (VerifyStats, error) {
	var st VerifyStats
	refs, err := f.store.ListRefs("cowfs/")
	if err != nil {
		return st, fmt.Errorf("verify: list refs: %w", err)
	}
	names := make([]string, 0, len(refs))
	for r := range refs {
		names = append(names, r)
	}
	sort.Strings(names)
	type item struct {
		path string
		e    Entry // the entry naming the object (a dir or a file)
	}
	seen := map[chunkstore.ID]bool{}
	for _, ref := range names {
		id := refs[ref]
		problem := func(path string, id chunkstore.ID, err error) {
			st.Problems++
			report(Problem{Ref: ref, Path: path, ID: id, Err: err})
		}
		if name, ok := strings.CutPrefix(ref, refMeta); ok {
			if _, err := f.readMeta(name); err != nil {
				problem("/", id, err)
			}
			continue
		}
		if name, ok := strings.CutPrefix(ref, refPending); ok {
			if _, _, err := f.readLog(name); err != nil {
				problem("/", id, err)
			}
			continue
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		st.Trees++
		top, err := f.rootEntry(id)
		if err != nil {
			problem("/", id, err)
			continue
		}
		stack := []item{{path: "/", e: top}}
		for len(stack) > 0 {
			if err := ctx.Err(); err != nil {
				return st, err
			}
			it := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if it.e.ID.IsZero() || seen[it.e.ID] {
				continue
			}
			seen[it.e.ID] = true
			if it.e.Type == TypeFile {
				st.Files++
				if err := f.verifyFile(it.e.ID, it.e.Size, seen, &st); err != nil {
					problem(it.path, it.e.ID, err)
				}
				continue
			}
			st.Dirs++
			es, err := getDir(f.store, it.e.ID)
			if err != nil {
				problem(it.path, it.e.ID, err)
				continue
			}
			for _, c := range es {
				if c.Type == TypeDir || c.Type == TypeFile {
					p := it.path + c.Name
					if c.Type == TypeDir {
						p += "/"
					}
					stack = append(stack, item{path: p, e: c})
				}
			}
		}
	}
	return st, nil
}

// verifyFile decodes file object id and its leaves and checks that they
// add up to size and that their chunks are in the store.
func (f *FS) verifyFile(id chunkstore.ID, size int64, seen map[chunkstore.ID]bool, st *VerifyStats) error {
	links, payload, err := f.store.GetNode(id)
	if err != nil {
		return fmt.Errorf("read file object: %w", err)
	}
	h, err := decodeFile(links, payload)
	if err != nil {
		return err
	}
	if h.size != size {
		return fmt.Errorf("%w: file object holds %d bytes, its entry says %d", errCorrupt, h.size, size)
	}
	chunks := func(refs []fileRef) error {
		for _, r := range refs {
			if r.ID.IsZero() || seen[r.ID] {
				continue
			}
			if !f.store.Has(r.ID) {
				return fmt.Errorf("chunk %s: %w", r.ID, chunkstore.ErrNotFound)
			}
			seen[r.ID] = true
			st.Chunks++
		}
		return nil
	}
	if !h.index {
		return chunks(h.refs)
	}
	for _, lf := range h.leaves {
		if seen[lf.id] {
			continue
		}
		seen[lf.id] = true
		st.Files++
		ll, lp, err := f.store.GetNode(lf.id)
		if err != nil {
			return fmt.Errorf("read file leaf %s: %w", lf.id, err)
		}
		lh, err := decodeFile(ll, lp)
		if err != nil {
			return fmt.Errorf("file leaf %s: %w", lf.id, err)
		}
		if lh.index || lh.size != lf.bytes || len(lh.refs) != lf.nrefs {
			return fmt.Errorf("file leaf %s: %w: leaf does not match its index entry", lf.id, errCorrupt)
		}
		if err := chunks(lh.refs); err != nil {
			return fmt.Errorf("file leaf %s: %w", lf.id, err)
		}
	}
	return nil
}
