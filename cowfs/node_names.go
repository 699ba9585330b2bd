package cowfs

import (
	"context"
	"sort"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// newInode makes a fresh inode owned by the caller. Caller holds b.mu.
func (b *branch) newInode(ctx context.Context, d *inode, typ EntryType, mode uint32) *inode {
	t := nowNs()
	in := &inode{ino: b.nextIno, typ: typ, mode: mode & 07777, nlink: 1, parents: map[*inode]int{},
		mtime: t, ctime: t, atime: t}
	b.nextIno++
	if c, ok := fuse.FromContext(ctx); ok {
		in.uid, in.gid = c.Uid, c.Gid
	}
	if d.mode&syscall.S_ISGID != 0 {
		in.gid = d.gid
		if typ == TypeDir {
			in.mode |= syscall.S_ISGID
		}
	}
	switch typ {
	case TypeDir:
		in.loaded, in.children, in.dirty = true, map[string]*inode{}, true
	case TypeFile:
		in.f = &fileData{changed: false}
		in.f.setRefs(nil)
	}
	return in
}

// addChild links c into d as name, within the limits (see checkAdd).
// Caller holds b.mu.
func (b *branch) addChild(d *inode, name string, c *inode) error {
	if err := b.checkAdd(d, name, c); err != nil {
		return err
	}
	d.encBytes += c.cost(name)
	d.children[name] = c
	d.subdirs += c.dirLinks()
	c.parents[d]++
	t := nowNs()
	d.mtime, d.ctime = t, t
	d.dirty = true
	return b.touch(d)
}

func (n *node) dirFor(name string) (*inode, syscall.Errno) {
	if !n.b.bound() {
		return nil, syscall.EROFS
	}
	d := n.cur()
	if d.typ != TypeDir {
		return nil, syscall.ENOTDIR
	}
	if err := n.b.load(d); err != nil {
		return nil, syscall.EIO
	}
	if len(name) > 255 {
		return nil, syscall.ENAMETOOLONG
	}
	if d.children[name] != nil {
		return d, syscall.EEXIST
	}
	return d, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	d, errno := n.dirFor(name)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	c := b.newInode(ctx, d, TypeFile, mode)
	c.f.changed = true
	if err := b.addChild(d, name, c); err != nil {
		return nil, nil, 0, toErrno(err)
	}
	ch := n.child(ctx, c, out)
	h := b.newHandle(ch.Operations().(*node), c, flags, b.keepCache)
	c.opens++
	c.cachedOpens++
	return ch, h, h.openFlags(), 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	d, errno := n.dirFor(name)
	if errno != 0 {
		return nil, errno
	}
	c := b.newInode(ctx, d, TypeDir, mode)
	if err := b.addChild(d, name, c); err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, c, out), 0
}

func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	typ, ok := typeOfMode(mode)
	if !ok || typ == TypeDir || typ == TypeSymlink {
		return nil, syscall.EINVAL
	}
	d, errno := n.dirFor(name)
	if errno != 0 {
		return nil, errno
	}
	c := b.newInode(ctx, d, typ, mode)
	if typ == TypeFile {
		c.f.changed = true
	}
	c.rdev = uint64(dev)
	if err := b.addChild(d, name, c); err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, c, out), 0
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	d, errno := n.dirFor(name)
	if errno != 0 {
		return nil, errno
	}
	c := b.newInode(ctx, d, TypeSymlink, 0o777)
	c.target = target
	if err := b.addChild(d, name, c); err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, c, out), 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	n.b.mu.Lock()
	defer n.b.mu.Unlock()
	in := n.cur()
	if in.typ != TypeSymlink {
		return nil, syscall.EINVAL
	}
	return []byte(in.target), 0
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	b := n.b
	tn, ok := target.(*node)
	if !ok || tn.b != b {
		return nil, syscall.EXDEV
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	d, errno := n.dirFor(name)
	if errno != 0 {
		return nil, errno
	}
	c := tn.cur()
	if c.typ == TypeDir {
		return nil, syscall.EPERM
	}
	switch {
	case c.nlink == 0 && !c.linkable:
		return nil, syscall.ENOENT
	case c.nlink >= maxLinks:
		return nil, syscall.EMLINK
	}
	if err := b.addChild(d, name, c); err != nil {
		return nil, toErrno(err)
	}
	if c.nlink == 0 { // an O_TMPFILE file gets its first name
		c.linkable = false
		delete(b.orphans, c)
	} else {
		if c.linkID == 0 {
			c.linkID = randomLinkID()
		}
		b.linked[c.linkID] = c
	}
	c.nlink++
	c.ctime = nowNs()
	if err := b.touch(c); err != nil {
		return nil, syscall.EIO
	}
	return n.child(ctx, c, out), 0
}

// removeName drops name from d. Caller holds b.mu.
func (b *branch) removeName(d *inode, name string) error {
	c := d.children[name]
	d.encBytes -= c.cost(name)
	delete(d.children, name)
	d.subdirs -= c.dirLinks()
	c.parents[d]--
	if c.parents[d] <= 0 {
		delete(c.parents, d)
	}
	held := -nameCost(name)
	if len(c.parents) == 0 { // its last name: the inode leaves the tree
		held -= c.inodeCost() + c.xbytes
	}
	b.countHeld(held)
	t := nowNs()
	d.mtime, d.ctime = t, t
	d.dirty = true
	if err := b.touch(d); err != nil {
		return err
	}
	c.ctime = t
	if c.typ == TypeDir {
		c.nlink = 0
		return nil
	}
	c.nlink--
	if c.nlink > 0 {
		return b.touch(c)
	}
	if c.opens == 0 {
		if c.f != nil {
			b.dropOverlay(c.f)
		}
	} else if c.f != nil {
		b.orphans[c] = c
	}
	return nil
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	d := n.cur()
	if err := b.load(d); err != nil {
		return syscall.EIO
	}
	c := d.children[name]
	if c == nil {
		return syscall.ENOENT
	}
	if c.typ == TypeDir {
		return syscall.EISDIR
	}
	if err := b.removeName(d, name); err != nil {
		return syscall.EIO
	}
	return 0
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	d := n.cur()
	if err := b.load(d); err != nil {
		return syscall.EIO
	}
	c := d.children[name]
	if c == nil {
		return syscall.ENOENT
	}
	if c.typ != TypeDir {
		return syscall.ENOTDIR
	}
	if err := b.load(c); err != nil {
		return syscall.EIO
	}
	if len(c.children) > 0 {
		return syscall.ENOTEMPTY
	}
	if err := b.removeName(d, name); err != nil {
		return syscall.EIO
	}
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	b := n.b
	np, ok := newParent.(*node)
	if !ok || np.b != b {
		return syscall.EXDEV
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	src, dst := n.cur(), np.cur()
	if err := b.load(src); err != nil {
		return syscall.EIO
	}
	if err := b.load(dst); err != nil {
		return syscall.EIO
	}
	c := src.children[name]
	if c == nil {
		return syscall.ENOENT
	}
	if err := nameErr(newName); err != nil {
		return toErrno(err)
	}
	victim := dst.children[newName]
	if victim == c {
		return 0 // both names are links to one inode: nothing to do
	}
	const noReplace, exchange = 1, 2
	if flags&^(noReplace|exchange) != 0 {
		return syscall.EINVAL
	}
	if flags&noReplace != 0 && victim != nil {
		return syscall.EEXIST
	}
	if c.typ == TypeDir && isAncestor(c, dst) {
		return syscall.EINVAL
	}
	if flags&exchange != 0 {
		if victim == nil {
			return syscall.ENOENT
		}
		if victim.typ == TypeDir && isAncestor(victim, src) {
			return syscall.EINVAL
		}
		dc, sc := c.cost(newName)-victim.cost(newName), victim.cost(name)-c.cost(name)
		if err := roomFor(dst, 0, dc); err != nil {
			return toErrno(err)
		}
		if err := roomFor(src, 0, sc); err != nil {
			return toErrno(err)
		}
		src.children[name], dst.children[newName] = victim, c
		src.subdirs += victim.dirLinks() - c.dirLinks()
		dst.subdirs += c.dirLinks() - victim.dirLinks()
		dst.encBytes += dc
		src.encBytes += sc
		moveParent(c, src, dst)
		moveParent(victim, dst, src)
	} else {
		if victim != nil {
			if victim.typ == TypeDir {
				if c.typ != TypeDir {
					return syscall.EISDIR
				}
				if err := b.load(victim); err != nil {
					return syscall.EIO
				}
				if len(victim.children) > 0 {
					return syscall.ENOTEMPTY
				}
			} else if c.typ == TypeDir {
				return syscall.ENOTDIR
			}
		}
		entries, bytes := 1, c.cost(newName)
		if victim != nil {
			entries, bytes = 0, bytes-victim.cost(newName)
		}
		if src == dst {
			entries, bytes = entries-1, bytes-c.cost(name)
		}
		if err := roomFor(dst, entries, bytes); err != nil {
			return toErrno(err)
		}
		if victim != nil {
			if err := b.removeName(dst, newName); err != nil {
				return syscall.EIO
			}
		}
		b.countHeld(int64(len(newName) - len(name)))
		src.encBytes -= c.cost(name)
		delete(src.children, name)
		src.subdirs -= c.dirLinks()
		dst.encBytes += c.cost(newName)
		dst.children[newName] = c
		dst.subdirs += c.dirLinks()
		moveParent(c, src, dst)
	}
	t := nowNs()
	for _, d := range []*inode{src, dst} {
		d.mtime, d.ctime = t, t
		d.dirty = true
		if err := b.touch(d); err != nil {
			return syscall.EIO
		}
	}
	c.ctime = t
	if err := b.touch(c); err != nil {
		return syscall.EIO
	}
	return 0
}

func moveParent(c, from, to *inode) {
	c.parents[from]--
	if c.parents[from] <= 0 {
		delete(c.parents, from)
	}
	c.parents[to]++
}

// isAncestor reports whether a is d or one of d's ancestors.
func isAncestor(a, d *inode) bool {
	for d != nil {
		if d == a {
			return true
		}
		var up *inode
		for p := range d.parents {
			up = p
		}
		d = up
	}
	return false
}

func (n *node) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	list, errno := n.listDir()
	if errno != 0 {
		return nil, errno
	}
	return gofs.NewListDirStream(list), 0
}

// listDir returns the directory's entries sorted by name.
func (n *node) listDir() ([]fuse.DirEntry, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	d := n.cur()
	if err := b.load(d); err != nil {
		return nil, syscall.EIO
	}
	names := make([]string, 0, len(d.children))
	for name := range d.children {
		names = append(names, name)
	}
	sort.Strings(names)
	list := make([]fuse.DirEntry, 0, len(names))
	for _, name := range names {
		c := d.children[name]
		list = append(list, fuse.DirEntry{Name: name, Mode: typeBits(c.typ), Ino: c.ino})
	}
	return list, 0
}
