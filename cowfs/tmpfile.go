package cowfs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

var _ = (gofs.NodeTmpfiler)((*node)(nil))

// Tmpfile creates a file with no name in the directory, as open(2) with
// O_TMPFILE does. It is an orphan, in no tree and gone at its last close,
// unless linkat gives it a name first.
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	d, errno := n.dirFor("")
	if errno != 0 {
		return nil, nil, 0, errno
	}
	c := b.newInode(ctx, d, TypeFile, mode)
	c.nlink = 0
	c.linkable = flags&syscall.O_EXCL == 0
	c.f.changed = true
	b.orphans[c] = c
	ch := n.child(ctx, c, out)
	h := b.newHandle(ch.Operations().(*node), c, flags, false)
	c.opens++
	c.cachedOpens++
	return ch, h, 0, 0
}
