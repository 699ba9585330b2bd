package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"tine/chunkstore"
)

// inode is one file, directory or other node of a live branch. All fields
// are guarded by the branch mutex.
type inode struct {
	ino      uint64
	typ      EntryType
	mode     uint32 // 07777 bits
	uid, gid uint32
	mtime    int64 // ns
	ctime    int64
	atime    int64
	xattrs   map[string][]byte
	xbytes   int64  // xattrCost summed over xattrs
	nlink    uint32 // names (files and other non-directories)
	linkable bool   // an unnamed O_TMPFILE file that linkat may still name
	linkID   uint64
	parents  map[*inode]int // directory -> number of names of this inode in it

	// directories
	loaded   bool
	children map[string]*inode
	encBytes int64         // directory: entryCost summed over children
	subdirs  uint32        // directory: children that are directories (its link count is 2 more)
	dirty    bool          // directory: entries changed since id was computed
	id       chunkstore.ID // directory: tree id when !dirty; file: content id when !f.changed()

	// files
	size        int64
	f           *fileData
	opens       int           // open handles
	cachedOpens int           // open non-passthrough handles
	backedOpens int           // open handles the kernel serves with a backing file (passthrough and direct)
	bk          *backing      // their backing file, while there are any
	putting     chan struct{} // while its content is put in the kernel's page cache: closed when that ends (pagestore.go)

	// symlinks and device nodes
	target string
	rdev   uint64
}

// branch is the live, mutable state of a mounted branch.
type branch struct {
	fs   *FS
	name string
	dir  string // branches/NAME

	mu          sync.Mutex
	root        *inode
	head        chunkstore.ID // last committed root object (the branch ref)
	nextIno     uint64
	linked      map[uint64]*inode // hard-link groups loaded so far
	meta        branchMeta
	savedMeta   branchMeta        // meta as last written to the store
	lock        *os.File          // flock held while mounted
	orphans     map[*inode]*inode // unlinked files still open
	passthrough bool
	backings    *backings // the mount's registered backing files
	rootNode    *node
	mountDir    string         // where the mount serving b is (serve)
	writing     map[*inode]int // files open for writing: their handles (see flushMapped)
	keepCache   bool           // plain opens and directory opens keep the kernel's caches (MountOptions.NoKeepCache)

	chunkCache    map[chunkstore.ID][]byte // small cache of decoded chunks
	chunkOrder    []chunkstore.ID
	overlays      overlayFiles         // open overlay files, least recently used first
	removals      overlayRemover       // overlay files being deleted off the request path
	memUsed       int64                // bytes of fileData.mem held by this branch's files
	held          int64                // bytes of names, inodes and xattrs made by the mount, less those removed (held.go)
	memFiles      map[*fileData]*inode // the files holding them, with their inodes
	memFlush      bool                 // a flush of them is under way (memflush.go)
	memFlushAfter time.Time            // no flush starts before this (memFlushBackoff)
	ovSeq         uint64               // numbers overlay files: no name is used twice while the branch is open

	logging *logging    // the files an fsync's commit is logging (fsynclog.go)
	pend    *liveLog    // the branch's fsync log, if it has one
	behind  *time.Timer // the commit that stores the log's bytes
}

func nowNs() int64 { return time.Now().UnixNano() }

// openBranch takes the branch's lock and loads its head.
func (f *FS) openBranch(name string) (*branch, error) {
	b := f.newBranch()
	if _, err := b.open(name, nil); err != nil {
		return nil, err
	}
	return b, nil
}

// newBranch makes an unbound branch whose root is an empty directory: a
// placeholder until open binds it to a branch.
func (f *FS) newBranch() *branch {
	root := &inode{ino: 1, typ: TypeDir, mode: 0o755, parents: map[*inode]int{},
		loaded: true, children: map[string]*inode{}}
	return &branch{fs: f, root: root, nextIno: 2, linked: map[uint64]*inode{},
		chunkCache: map[chunkstore.ID][]byte{}, orphans: map[*inode]*inode{}, writing: map[*inode]int{},
		memFiles: map[*fileData]*inode{}}
}

// bound reports whether open has bound b to a branch. Caller holds b.mu
// or owns b alone.
func (b *branch) bound() bool { return b.name != "" }

// stateDir is an empty branch state directory made ahead of time, its lock
// file already locked, for open to rename into place: that saves making a
// directory and a file (each a metadata update) when a branch is bound.
type stateDir struct {
	path string
	lock *os.File
}

// open binds the unbound b to branch name: it takes the branch's lock and
// loads its head. When pre is given and the branch has no state directory
// yet, pre becomes it (used reports that; pre is then b's). On error b
// stays unbound. Caller holds b.mu or owns b alone.
func (b *branch) open(name string, pre *stateDir) (used bool, err error) {
	f := b.fs
	head, ok, err := f.getRef(refBranch + name)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, fmt.Errorf("open branch %q: %w", name, ErrNoBranch)
	}
	dir := f.branchDir(name)
	var lk *os.File
	var meta branchMeta
	if pre != nil && os.Rename(pre.path, dir) == nil {
		// A new state directory: no overlay files and no settings file,
		// but the branch's settings (a quota set before its first mount)
		// may be in the store.
		lk, used = pre.lock, true
		if meta, err = f.readMeta(name); err != nil {
			lk.Close()
			return used, err
		}
	} else {
		// The overlay directory is made by the first write (a directory
		// costs a metadata update, which is slow next to the rest of a
		// fork).
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return false, fmt.Errorf("create branch dir %s: %w", dir, err)
		}
		lk, err = lockFile(filepath.Join(dir, "lock"))
		if err != nil {
			return false, fmt.Errorf("open branch %q: %w", name, err)
		}
		meta, err = f.readMeta(name)
		if err != nil {
			lk.Close()
			return false, err
		}
	}
	oldRoot, oldNext := b.root, b.nextIno
	b.name, b.dir = name, dir
	if err := b.loadRoot(head); err != nil {
		lk.Close()
		b.name, b.dir, b.root, b.nextIno = "", "", oldRoot, oldNext
		return used, err
	}
	b.lock, b.meta, b.savedMeta = lk, meta, meta
	if !used {
		// Overlay files from an earlier mount hold nothing committed,
		// but for those its fsync log names: the branch ref and the
		// log are the durable state.
		if err := b.foldLog(); err != nil {
			b.closeLocked()
			b.name, b.dir, b.root, b.nextIno = "", "", oldRoot, oldNext
			return used, err
		}
		b.removals.drain()
		olds, _ := filepath.Glob(filepath.Join(dir, "overlay", "*"))
		for _, o := range olds {
			os.Remove(o)
		}
	}
	return used, nil
}

func (b *branch) loadRoot(head chunkstore.ID) error {
	top, err := b.fs.rootEntry(head)
	if err != nil {
		return fmt.Errorf("branch %q: %w", b.name, err)
	}
	b.head = head
	b.linked = map[uint64]*inode{}
	root := b.fromEntry(&top)
	root.ino = 1
	b.root = root
	return nil
}

// fromEntry makes an unloaded inode for a stored entry.
func (b *branch) fromEntry(e *Entry) *inode {
	if e.LinkID != 0 {
		if in := b.linked[e.LinkID]; in != nil {
			return in
		}
	}
	in := &inode{
		ino: b.nextIno, typ: e.Type, mode: e.Mode, uid: e.UID, gid: e.GID,
		mtime: e.MtimeNs, ctime: e.MtimeNs, atime: e.MtimeNs,
		nlink: max(e.Nlink, 1), linkID: e.LinkID, parents: map[*inode]int{},
		id: e.ID, size: e.Size, target: e.Target, rdev: e.Rdev,
	}
	b.nextIno++
	if len(e.Xattrs) > 0 {
		in.xattrs = map[string][]byte{}
		for _, x := range e.Xattrs {
			in.xattrs[x.Name] = x.Value
			in.xbytes += xattrCost(x.Name, x.Value)
		}
	}
	if e.LinkID != 0 {
		b.linked[e.LinkID] = in
	}
	return in
}

// load reads a directory's entries on first use.
func (b *branch) load(d *inode) error {
	if d.typ != TypeDir || d.loaded {
		return nil
	}
	es, err := b.fs.getDir(d.id)
	if err != nil {
		return fmt.Errorf("branch %q: %w", b.name, err)
	}
	d.children = make(map[string]*inode, len(es))
	d.encBytes, d.subdirs = 0, 0
	for i := range es {
		c := b.fromEntry(&es[i])
		d.children[es[i].Name] = c
		c.parents[d]++
		d.encBytes += c.cost(es[i].Name)
		d.subdirs += c.dirLinks()
	}
	d.loaded = true
	return nil
}

// loadAll loads every directory of the branch. It is needed only when a
// hard-linked file changes while some of its names are still unloaded.
// It walks with a stack of its own, so a tree of any depth loads.
func (b *branch) loadAll(top *inode) error {
	stack := []*inode{top}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if err := b.load(d); err != nil {
			return err
		}
		for _, c := range d.children {
			if c.typ == TypeDir {
				stack = append(stack, c)
			}
		}
	}
	return nil
}

// dirLinks is what in adds to its parent directory's link count: 1 for a
// directory (its ".."), else 0.
func (in *inode) dirLinks() uint32 {
	if in.typ == TypeDir {
		return 1
	}
	return 0
}

func loadedNames(in *inode) uint32 {
	var n uint32
	for _, c := range in.parents {
		n += uint32(c)
	}
	return n
}

// touch records that in changed: every directory that names it must be
// re-encoded at the next commit.
func (b *branch) touch(in *inode) error {
	if in.linkID != 0 && loadedNames(in) < in.nlink {
		if err := b.loadAll(b.root); err != nil {
			return err
		}
	}
	b.dirtyUp(in)
	return nil
}

func (b *branch) dirtyUp(in *inode) {
	if in == b.root {
		in.dirty = true
	}
	stack := []*inode{in}
	for len(stack) > 0 {
		c := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for p := range c.parents {
			if !p.dirty {
				p.dirty = true
				stack = append(stack, p)
			}
		}
	}
}

// entryOf builds the stored entry for in (whose content ids are current).
func (in *inode) entry(name string) Entry {
	e := Entry{
		Name: name, Type: in.typ, Mode: in.mode, UID: in.uid, GID: in.gid,
		MtimeNs: in.mtime, Target: in.target, Rdev: in.rdev, Nlink: 1,
	}
	switch in.typ {
	case TypeFile:
		e.Size, e.ID = in.size, in.id
	case TypeDir:
		e.ID = in.id
	case TypeSymlink:
		e.Size = int64(len(in.target))
	}
	if in.typ != TypeDir && in.linkID != 0 && in.nlink > 1 {
		e.LinkID, e.Nlink = in.linkID, in.nlink
	}
	if len(in.xattrs) > 0 {
		for k, v := range in.xattrs {
			e.Xattrs = append(e.Xattrs, Xattr{Name: k, Value: v})
		}
		sort.Slice(e.Xattrs, func(i, j int) bool { return e.Xattrs[i].Name < e.Xattrs[j].Name })
	}
	return e
}

// toErrno turns an error into the errno the mount returns: the one it
// wraps, else EIO (0 for nil).
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

// reset switches the live branch to snapshot snap (rollback).
func (b *branch) reset(ctx context.Context, snap chunkstore.ID) error {
	b.mu.Lock()
	var names []string
	if b.root.loaded {
		for n := range b.root.children {
			names = append(names, n)
		}
	}
	err := b.resetLocked(snap)
	if err == nil && b.load(b.root) == nil {
		// Names that exist only in the new tree may sit in the kernel's
		// cache as negative entries: drop those too.
		for n := range b.root.children {
			names = append(names, n)
		}
	}
	b.mu.Unlock()
	if err == nil {
		b.notifyRollback(names)
	}
	return err
}

func (b *branch) resetLocked(snap chunkstore.ID) error {
	if _, err := b.fs.rootEntry(snap); err != nil {
		return err
	}
	b.walkLoaded(b.root, func(in *inode) {
		if in.f != nil {
			if in.opens == 0 {
				b.dropOverlay(in.f)
			} else {
				b.orphans[in] = in
			}
		}
	})
	ups := []chunkstore.RefUpdate{{Name: refBranch + b.name, Old: b.head, New: snap}}
	if b.pend != nil {
		ups = append(ups, chunkstore.RefUpdate{Name: refPending + b.name, Old: b.pend.id})
	}
	if err := b.fs.store.UpdateRefs(ups...); err != nil {
		return fmt.Errorf("branch %q: move head: %w", b.name, err)
	}
	b.setLog(nil)
	if err := b.loadRoot(snap); err != nil {
		return err
	}
	b.dropHeld()
	return nil
}
