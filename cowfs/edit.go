package cowfs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"tine/chunkstore"
)

// TreeEdit sets one path of a snapshot to an entry (its Name is taken
// from the path), or removes the path when Entry is nil. A directory
// entry with a zero ID keeps the contents of the directory it replaces,
// or is empty when there is none.
type TreeEdit struct {
	Path  string
	Entry *Entry
}

// ReadFileData returns the content of a file or symlink entry of a
// snapshot, refusing one larger than max bytes.
func (f *FS) ReadFileData(ctx context.Context, e *Entry, max int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if entrySize(e) > max {
		return nil, fmt.Errorf("read %q: %d bytes is more than %d", e.Name, entrySize(e), max)
	}
	r, err := f.contentReader(e)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(r, max))
}

// PutFileData stores data as the content of file entry meta and returns
// the entry with its ID and Size set.
func (f *FS) PutFileData(ctx context.Context, data []byte, meta Entry) (Entry, error) {
	refs, err := f.store.PutStream(ctx, bytes.NewReader(data))
	if err != nil {
		return meta, fmt.Errorf("store file %q: %w", meta.Name, err)
	}
	if meta.ID, err = putFile(f.store, fileRefs(refs)); err != nil {
		return meta, fmt.Errorf("store file %q: %w", meta.Name, err)
	}
	meta.Type, meta.Size, meta.Target, meta.LinkID, meta.Nlink = TypeFile, int64(len(data)), "", 0, 1
	return meta, nil
}

// editNode is one path of a set of edits: its own edit, if any, and the
// edits below it.
type editNode struct {
	set  bool
	e    *Entry
	kids map[string]*editNode
}

// EditSnapshot returns a new snapshot: snap with edits applied, kept in
// the store like any snapshot (DeleteSnapshot drops it). Each directory on
// the way to an edited path is rewritten once, whatever the number of
// edits below it. Removing a path below one that is removed is a no-op; any
// other edit below a path that is not a directory fails.
func (f *FS) EditSnapshot(ctx context.Context, snap SnapshotID, edits []TreeEdit) (SnapshotID, error) {
	top, err := f.rootEntry(snap)
	if err != nil {
		return SnapshotID{}, err
	}
	root := &editNode{}
	for _, ed := range edits {
		n := root
		if ed.Path != "" {
			for _, part := range strings.Split(ed.Path, "/") {
				if !validName(part) {
					return SnapshotID{}, fmt.Errorf("edit snapshot %s: bad path %q", snap, ed.Path)
				}
				if n.kids == nil {
					n.kids = map[string]*editNode{}
				}
				k := n.kids[part]
				if k == nil {
					k = &editNode{}
					n.kids[part] = k
				}
				n = k
			}
		}
		n.set, n.e = true, ed.Entry
	}
	if root.set {
		if root.e == nil || root.e.Type != TypeDir {
			return SnapshotID{}, fmt.Errorf("edit snapshot %s: the top directory can only be set to a directory", snap)
		}
		id := top.ID
		top = *root.e
		if top.ID.IsZero() {
			top.ID = id
		}
	}
	if top.ID, err = f.editDir(ctx, top.ID, root, ""); err != nil {
		return SnapshotID{}, err
	}
	id, err := putRoot(f.store, top)
	if err != nil {
		return id, fmt.Errorf("edit snapshot %s: write root: %w", snap, err)
	}
	return id, f.keepSnapshot(id)
}

// editDir applies the edits below n to directory object id ("zero" is an
// empty directory) and returns the new object's id.
func (f *FS) editDir(ctx context.Context, id chunkstore.ID, n *editNode, at string) (chunkstore.ID, error) {
	if err := ctx.Err(); err != nil {
		return id, err
	}
	var entries []Entry
	if !id.IsZero() {
		var err error
		if entries, err = getDir(f.store, id); err != nil {
			return id, err
		}
	}
	byName := make(map[string]Entry, len(entries)+len(n.kids))
	for _, e := range entries {
		byName[e.Name] = e
	}
	for name, k := range n.kids {
		p := join(at, name)
		if k.set {
			if k.e == nil {
				delete(byName, name)
			} else {
				e := *k.e
				e.Name = name
				if old, had := byName[name]; had && old.Type == TypeDir && e.Type == TypeDir && e.ID.IsZero() {
					e.ID = old.ID
				}
				byName[name] = e
			}
		}
		e, ok := byName[name]
		if e.Type == TypeDir && (len(k.kids) > 0 || e.ID.IsZero()) {
			sub, err := f.editDir(ctx, e.ID, k, p)
			if err != nil {
				return id, err
			}
			e.ID, e.Size = sub, 0
			byName[name] = e
		} else if len(k.kids) > 0 {
			if !ok && onlyRemovals(k) {
				continue // removals below a path that is gone already
			}
			if !ok {
				return id, fmt.Errorf("edit snapshot: %q is not there to hold edits below it", p)
			}
			return id, fmt.Errorf("edit snapshot: %q is a %s, not a directory", p, e.Type)
		}
	}
	out := make([]Entry, 0, len(byName))
	for _, e := range byName {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	nid, err := putDir(f.store, out)
	if err != nil {
		return id, fmt.Errorf("edit snapshot: store directory %q: %w", at, err)
	}
	return nid, nil
}

// onlyRemovals reports whether every edit below n removes a path.
func onlyRemovals(n *editNode) bool {
	for _, k := range n.kids {
		if k.set && k.e != nil || !onlyRemovals(k) {
			return false
		}
	}
	return true
}
