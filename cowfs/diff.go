package cowfs

import (
	"context"
	"fmt"
	"path"
)

// ChangeKind says how an entry differs between two snapshots.
type ChangeKind uint8

// The kinds of change Diff reports.
const (
	Added       ChangeKind = iota + 1 // only in the new snapshot
	Deleted                           // only in the old snapshot
	Modified                          // same type, other content (metadata may differ too)
	TypeChanged                       // file became directory, symlink became file, ...
	ModeChanged                       // same content, other mode, owner or xattrs
)

var kindNames = [...]string{"", "added", "deleted", "modified", "type-changed", "mode-changed"}

// String names the kind ("added", "deleted", ...).
func (k ChangeKind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Change is one path that differs between two snapshots. Old is nil for
// Added, New is nil for Deleted. Path is slash-separated and relative to
// the top directory ("" is the top directory itself).
type Change struct {
	Path string
	Kind ChangeKind
	Old  *Entry
	New  *Entry
}

// Diff lists what changed from snapshot a to snapshot b, sorted by path
// (a directory before its contents). Subtrees with equal ids are skipped
// unread, so the cost follows the size of the change, not of the tree.
// To diff against a live branch, pass its Head.
func (f *FS) Diff(ctx context.Context, a, b SnapshotID) ([]Change, error) {
	ea, err := f.rootEntry(a)
	if err != nil {
		return nil, err
	}
	eb, err := f.rootEntry(b)
	if err != nil {
		return nil, err
	}
	d := &differ{f: f, ctx: ctx}
	if err := d.entry("", &ea, &eb); err != nil {
		return nil, err
	}
	return d.out, nil
}

type differ struct {
	f   *FS
	ctx context.Context
	out []Change
}

func (d *differ) entry(p string, a, b *Entry) error {
	if err := d.ctx.Err(); err != nil {
		return err
	}
	switch {
	case a.Type != b.Type:
		d.out = append(d.out, Change{Path: p, Kind: TypeChanged, Old: a, New: b})
		// The contents of a directory that appeared or vanished are
		// listed too, so that a consumer can apply the change path by path.
		if a.Type == TypeDir {
			if err := d.all(p, a, Deleted); err != nil {
				return err
			}
		}
		if b.Type == TypeDir {
			return d.all(p, b, Added)
		}
		return nil
	case a.Type == TypeDir:
		if !sameMeta(a, b) {
			d.out = append(d.out, Change{Path: p, Kind: ModeChanged, Old: a, New: b})
		}
		if a.ID == b.ID {
			return nil
		}
		return d.dirs(p, a.ID, b.ID)
	case !sameContent(a, b):
		d.out = append(d.out, Change{Path: p, Kind: Modified, Old: a, New: b})
	case !sameMeta(a, b):
		d.out = append(d.out, Change{Path: p, Kind: ModeChanged, Old: a, New: b})
	}
	return nil
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return path.Join(dir, name)
}

// dirs merges two sorted directory listings.
func (d *differ) dirs(p string, a, b SnapshotID) error {
	as, err := getDir(d.f.store, a)
	if err != nil {
		return err
	}
	bs, err := getDir(d.f.store, b)
	if err != nil {
		return err
	}
	i, j := 0, 0
	for i < len(as) || j < len(bs) {
		switch {
		case j >= len(bs) || (i < len(as) && as[i].Name < bs[j].Name):
			e := &as[i]
			d.out = append(d.out, Change{Path: join(p, e.Name), Kind: Deleted, Old: e})
			if e.Type == TypeDir {
				if err := d.all(join(p, e.Name), e, Deleted); err != nil {
					return err
				}
			}
			i++
		case i >= len(as) || bs[j].Name < as[i].Name:
			e := &bs[j]
			d.out = append(d.out, Change{Path: join(p, e.Name), Kind: Added, New: e})
			if e.Type == TypeDir {
				if err := d.all(join(p, e.Name), e, Added); err != nil {
					return err
				}
			}
			j++
		default:
			if err := d.entry(join(p, as[i].Name), &as[i], &bs[j]); err != nil {
				return err
			}
			i++
			j++
		}
	}
	return nil
}

// all lists everything below directory entry e as added or deleted.
func (d *differ) all(p string, e *Entry, kind ChangeKind) error {
	es, err := getDir(d.f.store, e.ID)
	if err != nil {
		return err
	}
	for i := range es {
		c := &es[i]
		ch := Change{Path: join(p, c.Name), Kind: kind}
		if kind == Added {
			ch.New = c
		} else {
			ch.Old = c
		}
		d.out = append(d.out, ch)
		if c.Type == TypeDir {
			if err := d.all(ch.Path, c, kind); err != nil {
				return err
			}
		}
	}
	return nil
}
