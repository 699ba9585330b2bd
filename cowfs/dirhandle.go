package cowfs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// dirHandle is an open directory: "." and "..", then the listing taken
// at the first read, served by position. The kernel keeps what it read
// in its directory cache across opens (FOPEN_CACHE_DIR with
// FOPEN_KEEP_CACHE) and drops it itself when the directory changes
// through the mount; a change behind its back (rollback) is announced
// with a notify (ADR 0160).
type dirHandle struct {
	n    *node
	list []fuse.DirEntry
	read bool
	pos  int
}

var (
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.FileReaddirenter   = (*dirHandle)(nil)
	_ gofs.FileSeekdirer      = (*dirHandle)(nil)
)

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	var fl uint32
	if n.b.keepCache {
		fl = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	}
	return &dirHandle{n: n}, fl, 0
}

func (d *dirHandle) fill(ctx context.Context) syscall.Errno {
	if d.read {
		return 0
	}
	list, errno := d.n.listDir()
	if errno != 0 {
		return errno
	}
	d.list, d.read = append(d.n.dots(), list...), true
	return 0
}

// dots returns the "." and ".." entries a directory listing starts with,
// as on a disk file system: the kernel passes them to getdents unchanged
// and never looks them up. The root's ".." names the root itself.
func (n *node) dots() []fuse.DirEntry {
	self := n.StableAttr().Ino
	parent := self
	if _, p := n.Parent(); p != nil {
		parent = p.StableAttr().Ino
	}
	return []fuse.DirEntry{
		{Name: ".", Mode: fuse.S_IFDIR, Ino: self},
		{Name: "..", Mode: fuse.S_IFDIR, Ino: parent},
	}
}

// Readdirent returns the next entry, or nil at the end.
func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if errno := d.fill(ctx); errno != 0 {
		return nil, errno
	}
	if d.pos >= len(d.list) {
		return nil, 0
	}
	e := d.list[d.pos]
	d.pos++
	return &e, 0
}

// Seekdir moves to entry off (0 is the start; rewinddir reads again).
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if off == 0 {
		d.read, d.list = false, nil
	}
	if errno := d.fill(ctx); errno != 0 {
		return errno
	}
	if off > uint64(len(d.list)) {
		off = uint64(len(d.list))
	}
	d.pos = int(off)
	return 0
}
