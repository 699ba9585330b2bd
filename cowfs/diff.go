package cowfs

import (
	"context"
	"fmt"
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

// Diff lists what changed from snapshot a to snapshot b, everything
// included (see DiffWith for the filtered view the exports use), in
// depth-first order: a directory before its contents, siblings by name.
// Subtrees with equal ids are skipped unread, so the cost follows the
// size of the change, not of the tree. To diff against a live branch,
// pass its Head.
func (f *FS) Diff(ctx context.Context, a, b SnapshotID) ([]Change, error) {
	return f.DiffWith(ctx, a, b, DiffOptions{GitInternals: true})
}

// differ walks two trees with an explicit stack, so that the depth of a
// tree a sandbox made costs heap, never goroutine stack.
type differ struct {
	f     *FS
	ctx   context.Context
	emit  func(Change) error // given each change, in order; an error ends the walk
	stack []dirPair
	// skip, when set, leaves out a path and everything below it. isDir
	// is the path's type in the new tree, or in the old one when deleted;
	// b is its entry in the new tree (nil when deleted).
	skip func(dir *dirPair, p string, isDir bool, b *Entry) (bool, error)
	// enter, when set, prepares a directory pair before its entries are
	// merged (reads its ignore rules).
	enter func(parent, dir *dirPair) error
}

// dirPair is one directory on the walk's stack: the sorted listings of
// the path in the old and new trees (nil where it is not a directory) and
// how far the merge has come.
type dirPair struct {
	p      string
	as, bs []Entry
	i, j   int
	ign    *ignoreDir // ignore rules in force below p (nil: none)
}

func (d *differ) run(ea, eb *Entry) error {
	if err := d.pair("", ea, eb, nil); err != nil {
		return err
	}
	for len(d.stack) > 0 {
		if err := d.ctx.Err(); err != nil {
			return err
		}
		top := &d.stack[len(d.stack)-1]
		as, bs := top.as, top.bs
		var a, b *Entry
		switch {
		case top.i >= len(as) && top.j >= len(bs):
			d.stack = d.stack[:len(d.stack)-1]
			continue
		case top.j >= len(bs) || (top.i < len(as) && as[top.i].Name < bs[top.j].Name):
			a = &as[top.i]
			top.i++
		case top.i >= len(as) || bs[top.j].Name < as[top.i].Name:
			b = &bs[top.j]
			top.j++
		default:
			a, b = &as[top.i], &bs[top.j]
			top.i++
			top.j++
		}
		p := join(top.p, nameOf(a, b))
		if d.skip != nil {
			isDir := (b != nil && b.Type == TypeDir) || (b == nil && a.Type == TypeDir)
			if skip, err := d.skip(top, p, isDir, b); err != nil || skip {
				if err != nil {
					return err
				}
				continue
			}
		}
		if err := d.pair(p, a, b, top); err != nil {
			return err
		}
	}
	return nil
}

func nameOf(a, b *Entry) string {
	if a != nil {
		return a.Name
	}
	return b.Name
}

// pair reports how a (nil: absent) became b (nil: absent) at p and, where
// either is a directory whose contents may differ, pushes it on the stack.
func (d *differ) pair(p string, a, b *Entry, parent *dirPair) error {
	var kind ChangeKind
	switch {
	case a == nil:
		kind = Added
	case b == nil:
		kind = Deleted
	case a.Type != b.Type:
		kind = TypeChanged
	case a.Type == TypeDir:
		if !sameMeta(a, b) {
			kind = ModeChanged
		}
		if a.ID == b.ID {
			// Same contents: nothing below differs.
			if kind != 0 {
				return d.emit(Change{Path: p, Kind: kind, Old: a, New: b})
			}
			return nil
		}
	case !sameContent(a, b):
		kind = Modified
	case !sameMeta(a, b):
		kind = ModeChanged
	}
	if kind != 0 {
		if err := d.emit(Change{Path: p, Kind: kind, Old: a, New: b}); err != nil {
			return err
		}
	}
	// The contents of a directory that appeared or vanished are listed
	// too, so that a consumer can apply the change path by path.
	dp := dirPair{p: p}
	var err error
	if a != nil && a.Type == TypeDir {
		if dp.as, err = d.f.getDir(a.ID); err != nil {
			return err
		}
	}
	if b != nil && b.Type == TypeDir {
		if dp.bs, err = d.f.getDir(b.ID); err != nil {
			return err
		}
	}
	if dp.as == nil && dp.bs == nil {
		return nil
	}
	if parent != nil {
		dp.ign = parent.ign
	}
	if d.enter != nil {
		if err := d.enter(parent, &dp); err != nil {
			return err
		}
	}
	d.stack = append(d.stack, dp)
	return nil
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}
