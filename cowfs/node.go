package cowfs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is the FUSE face of an inode.
type node struct {
	gofs.Inode
	b     *branch
	in    *inode
	paged bool // the kernel's page cache holds the file's content, put there and unchanged since (pagestore.go)
}

var (
	_ gofs.NodeLookuper      = (*node)(nil)
	_ gofs.NodeGetattrer     = (*node)(nil)
	_ gofs.NodeSetattrer     = (*node)(nil)
	_ gofs.NodeOpener        = (*node)(nil)
	_ gofs.NodeCreater       = (*node)(nil)
	_ gofs.NodeReader        = (*node)(nil)
	_ gofs.NodeWriter        = (*node)(nil)
	_ gofs.NodeFsyncer       = (*node)(nil)
	_ gofs.NodeMkdirer       = (*node)(nil)
	_ gofs.NodeMknoder       = (*node)(nil)
	_ gofs.NodeRmdirer       = (*node)(nil)
	_ gofs.NodeUnlinker      = (*node)(nil)
	_ gofs.NodeRenamer       = (*node)(nil)
	_ gofs.NodeLinker        = (*node)(nil)
	_ gofs.NodeSymlinker     = (*node)(nil)
	_ gofs.NodeReadlinker    = (*node)(nil)
	_ gofs.NodeReaddirer     = (*node)(nil)
	_ gofs.NodeStatfser      = (*node)(nil)
	_ gofs.NodeGetxattrer    = (*node)(nil)
	_ gofs.NodeSetxattrer    = (*node)(nil)
	_ gofs.NodeListxattrer   = (*node)(nil)
	_ gofs.NodeRemovexattrer = (*node)(nil)
	_ gofs.NodeAllocater     = (*node)(nil)
	_ gofs.NodeLseeker       = (*node)(nil)
)

func typeBits(t EntryType) uint32 {
	switch t {
	case TypeDir:
		return syscall.S_IFDIR
	case TypeSymlink:
		return syscall.S_IFLNK
	case TypeFifo:
		return syscall.S_IFIFO
	case TypeChar:
		return syscall.S_IFCHR
	case TypeBlock:
		return syscall.S_IFBLK
	case TypeSocket:
		return syscall.S_IFSOCK
	}
	return syscall.S_IFREG
}

func typeOfMode(mode uint32) (EntryType, bool) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG, 0:
		return TypeFile, true
	case syscall.S_IFDIR:
		return TypeDir, true
	case syscall.S_IFLNK:
		return TypeSymlink, true
	case syscall.S_IFIFO:
		return TypeFifo, true
	case syscall.S_IFCHR:
		return TypeChar, true
	case syscall.S_IFBLK:
		return TypeBlock, true
	case syscall.S_IFSOCK:
		return TypeSocket, true
	}
	return 0, false
}

// fillAttr fills out from in. Caller holds b.mu.
func (b *branch) fillAttr(in *inode, out *fuse.Attr) {
	out.Ino = in.ino
	out.Mode = typeBits(in.typ) | in.mode
	out.Uid, out.Gid = in.uid, in.gid
	out.Nlink = in.nlink
	switch in.typ {
	case TypeDir:
		out.Nlink = 2 + b.subdirCount(in)
		out.Size = 4096
	case TypeFile:
		out.Size = uint64(in.size)
	case TypeSymlink:
		out.Size = uint64(len(in.target))
	}
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = 4096
	out.Rdev = uint32(in.rdev)
	out.Atime, out.Atimensec = uint64(in.atime/1e9), uint32(in.atime%1e9)
	out.Mtime, out.Mtimensec = uint64(in.mtime/1e9), uint32(in.mtime%1e9)
	out.Ctime, out.Ctimensec = uint64(in.ctime/1e9), uint32(in.ctime%1e9)
}

// subdirCount is how many of directory in's entries are directories. An
// unloaded directory answers from its cached entries alone, so a stat
// builds no inode for each of its children; one too big for the cache is
// loaded, once. An unreadable one counts none. Caller holds b.mu.
func (b *branch) subdirCount(in *inode) uint32 {
	if !in.loaded {
		if n, ok := b.fs.dirSubdirs(in.id); ok {
			return n
		}
	}
	if b.load(in) != nil {
		return 0
	}
	return in.subdirs
}

func (n *node) cur() *inode {
	if n.IsRoot() {
		return n.b.root
	}
	return n.in
}

// child makes the go-fuse inode for c. Caller holds b.mu.
func (n *node) child(ctx context.Context, c *inode, out *fuse.EntryOut) *gofs.Inode {
	n.b.fillAttr(c, &out.Attr)
	return n.NewInode(ctx, &node{b: n.b, in: c}, gofs.StableAttr{Mode: typeBits(c.typ), Ino: c.ino})
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.bound() {
		// Not ENOENT: the kernel would cache that answer into the branch
		// this placeholder is later bound to.
		return nil, syscall.EACCES
	}
	d := n.cur()
	if err := b.load(d); err != nil {
		return nil, syscall.EIO
	}
	c := d.children[name]
	if c == nil {
		return nil, syscall.ENOENT
	}
	return n.child(ctx, c, out), 0
}

func (n *node) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.b.mu.Lock()
	defer n.b.mu.Unlock()
	n.b.fillAttr(n.cur(), &out.Attr)
	return 0
}

func (n *node) Setattr(ctx context.Context, fh gofs.FileHandle, sa *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := sa.GetSize(); ok {
		b.waitPut(n.cur())
	}
	if !b.bound() {
		return syscall.EROFS
	}
	in := n.cur()
	if sa.Valid&fuse.FATTR_KILL_SUIDGID != 0 && sa.Valid&^(fuse.FATTR_KILL_SUIDGID|fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) == 0 &&
		killSUIDGID(in.mode) == in.mode {
		// Only a write's request to clear bits the file does not have
		// (rawfs.go): nothing changes, not even ctime.
		b.fillAttr(in, &out.Attr)
		return 0
	}
	if sz, ok := sa.GetSize(); ok {
		if in.typ != TypeFile {
			if in.typ == TypeDir {
				return syscall.EISDIR
			}
			return syscall.EINVAL
		}
		if err := b.truncate(in, int64(sz)); err != nil {
			return toErrno(err)
		}
	}
	if m, ok := sa.GetMode(); ok {
		in.mode = m & 07777
	}
	if sa.Valid&fuse.FATTR_KILL_SUIDGID != 0 {
		in.mode = killSUIDGID(in.mode)
	}
	if u, ok := sa.GetUID(); ok {
		in.uid = u
	}
	if g, ok := sa.GetGID(); ok {
		in.gid = g
	}
	if t, ok := sa.GetATime(); ok {
		in.atime = t.UnixNano()
	}
	if t, ok := sa.GetMTime(); ok {
		in.mtime = t.UnixNano()
	}
	in.ctime = nowNs()
	if t, ok := sa.GetCTime(); ok {
		in.ctime = t.UnixNano()
	}
	if err := b.touch(in); err != nil {
		return syscall.EIO
	}
	b.fillAttr(in, &out.Attr)
	return 0
}
