package cowfs

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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

// extent is a dirty byte range [off, end) of a file.
type extent struct{ off, end int64 }

// fileData is a file's content while the branch is live: the committed
// chunk list plus a sparse overlay file holding the bytes written since.
type fileData struct {
	refs    []fileRef
	offs    []int64 // offs[i] is where refs[i] starts; offs[len(refs)] = baseLen
	dirty   []extent
	changed bool          // content differs from id
	gen     uint64        // counts changes of content (write, truncate, punch)
	mem     []byte        // written bytes kept in memory, when ovPath is "" (see memfile.go)
	ov      *os.File      // the overlay file while open (see overlay.go)
	ovPath  string        // the overlay file's path once made
	ovElem  *list.Element // place among the branch's open overlays
}

func (fd *fileData) baseLen() int64 { return fd.offs[len(fd.refs)] }

func (fd *fileData) setRefs(refs []fileRef) {
	fd.refs = refs
	fd.offs = make([]int64, len(refs)+1)
	for i, r := range refs {
		fd.offs[i+1] = fd.offs[i] + r.Size
	}
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

// commit writes what changed since the last commit and returns the new
// root object id. Caller holds b.mu.
func (b *branch) commit(ctx context.Context) (chunkstore.ID, error) {
	if !b.root.dirty && !b.head.IsZero() {
		return b.head, nil
	}
	if err := b.commitDir(ctx, b.root); err != nil {
		return chunkstore.ID{}, err
	}
	id, err := putRoot(b.fs.store, b.root.entry(rootName))
	if err != nil {
		return id, fmt.Errorf("branch %q: write root: %w", b.name, err)
	}
	return id, nil
}

// commitDir writes the dirty directories under top, children before
// parents. It walks with a stack of its own, so a tree of any depth
// commits. Each directory object written is charged to the quota: a
// commit of a changed directory stores all of it again.
func (b *branch) commitDir(ctx context.Context, top *inode) error {
	type frame struct {
		d        *inode
		path     []string // names from top, kept only while an fsync logs files
		expanded bool
	}
	stack := []frame{{d: top}}
	for len(stack) > 0 {
		i := len(stack) - 1
		d := stack[i].d
		if !d.dirty {
			stack = stack[:i]
			continue
		}
		if !stack[i].expanded {
			stack[i].expanded = true
			for name, c := range d.children {
				if c.typ == TypeDir && c.dirty {
					f := frame{d: c}
					if b.logging != nil {
						f.path = append(stack[i].path[:len(stack[i].path):len(stack[i].path)], name)
					}
					stack = append(stack, f)
				}
			}
			continue
		}
		path := stack[i].path
		stack = stack[:i]
		if err := ctx.Err(); err != nil {
			return err
		}
		entries := make([]Entry, 0, len(d.children))
		for name, c := range d.children {
			if b.logging != nil && c.typ == TypeFile && c.f != nil && b.logging.loggable(c.f) {
				le, ok, err := b.logFile(c, append(path[:len(path):len(path)], name))
				if err != nil {
					return err
				}
				if ok {
					e := c.entry(name)
					e.ID, e.Size = le.id, le.size
					entries = append(entries, e)
					continue
				}
			}
			if c.typ == TypeFile {
				if err := b.commitFile(ctx, c); err != nil {
					return err
				}
			}
			entries = append(entries, c.entry(name))
		}
		links, payload, err := encodeDir(entries)
		if err == nil {
			d.id, err = b.fs.store.PutNode(links, payload)
		}
		if err != nil {
			return fmt.Errorf("branch %q: write directory (inode %d): %w", b.name, d.ino, err)
		}
		d.dirty = false
		b.meta.UsedBytes += int64(len(payload) + len(links)*len(chunkstore.ID{}))
	}
	return nil
}

// commitFile turns a file's overlay into chunks (cutFile) and makes them
// its content. Caller holds b.mu.
func (b *branch) commitFile(ctx context.Context, in *inode) error {
	fd := in.f
	if fd == nil || !fd.changed {
		return nil
	}
	out, err := cutFile(ctx, b.fs.store, b.name, fd, in.size, func(p []byte, off int64) (int, error) {
		return b.readAt(in, p, off)
	})
	if err != nil {
		return err
	}
	return b.installFile(in, out)
}

// installFile makes refs, the chunks cutFile made of the file's content,
// its committed content. Caller holds b.mu.
func (b *branch) installFile(in *inode, refs []fileRef) error {
	id, err := putFile(b.fs.store, refs)
	if err != nil {
		return fmt.Errorf("branch %q: write file object: %w", b.name, err)
	}
	fd := in.f
	fd.setRefs(refs)
	fd.dirty = nil
	fd.changed = false
	b.dropOverlay(fd) // its bytes are in the store now
	in.id = id
	return nil
}

// cutFile stores a file's content (size bytes, read with read) as chunks
// and returns them: unchanged base chunks of fd are kept by reference;
// only runs of chunks that overlap written bytes, and the bytes past the
// base, are read and cut again. It reads fd and never changes it; name is
// the branch's, for errors.
func cutFile(ctx context.Context, st *chunkstore.Store, name string, fd *fileData, size int64, read readerAtFunc) ([]fileRef, error) {
	var out []fileRef
	n := len(fd.refs)
	i := 0
	for i < n {
		if !fd.overlaps(fd.offs[i], fd.offs[i+1]) {
			out = append(out, fd.refs[i])
			i++
			continue
		}
		j := i
		for j < n && fd.overlaps(fd.offs[j], fd.offs[j+1]) {
			j++
		}
		if j == n {
			break // the run reaches the end of the base: cut it with the tail
		}
		refs, err := chunkRegion(ctx, st, name, fd, read, fd.offs[i], fd.offs[j])
		if err != nil {
			return nil, err
		}
		out = append(out, refs...)
		i = j
	}
	if start := fd.offs[i]; start < size {
		refs, err := chunkRegion(ctx, st, name, fd, read, start, size)
		if err != nil {
			return nil, err
		}
		out = append(out, refs...)
	}
	return out, nil
}

// chunkRegion cuts [a, e) of the file's content into chunks; stretches
// that hold no data (holes of the base, never written, or punched) stay
// holes, one ref each whatever their length.
func chunkRegion(ctx context.Context, st *chunkstore.Store, name string, fd *fileData, read readerAtFunc, a, e int64) ([]fileRef, error) {
	var out []fileRef
	for a < e {
		data, next := fd.isData(a, e)
		next = min(next, e)
		if !data {
			out = appendHole(out, next-a)
			a = next
			continue
		}
		// Data up to the next hole.
		for next < e {
			d, n := fd.isData(next, e)
			if !d {
				break
			}
			next = min(n, e)
		}
		refs, err := st.PutStream(ctx, io.NewSectionReader(read, a, next-a))
		if err != nil {
			return nil, fmt.Errorf("branch %q: store file data: %w", name, err)
		}
		var got int64
		for _, r := range refs {
			got += int64(r.Size)
		}
		if got != next-a {
			return nil, fmt.Errorf("branch %q: store file data: stored %d bytes of %d", name, got, next-a)
		}
		out = append(out, fileRefs(refs)...)
		a = next
	}
	return out, nil
}

type readerAtFunc func(p []byte, off int64) (int, error)

func (f readerAtFunc) ReadAt(p []byte, off int64) (int, error) { return f(p, off) }

// extentAfter returns the index of the first dirty extent ending after pos.
func (fd *fileData) extentAfter(pos int64) int {
	return sort.Search(len(fd.dirty), func(i int) bool { return fd.dirty[i].end > pos })
}

func (fd *fileData) overlaps(a, e int64) bool {
	i := fd.extentAfter(a)
	return i < len(fd.dirty) && fd.dirty[i].off < e
}

func (fd *fileData) addExtent(a, e int64) {
	if a >= e {
		return
	}
	i := sort.Search(len(fd.dirty), func(i int) bool { return fd.dirty[i].end >= a })
	j := i
	for j < len(fd.dirty) && fd.dirty[j].off <= e {
		a = min(a, fd.dirty[j].off)
		e = max(e, fd.dirty[j].end)
		j++
	}
	fd.dirty = append(fd.dirty[:i], append([]extent{{a, e}}, fd.dirty[j:]...)...)
}

// cutExtents forgets the written bytes in [a, e).
func (fd *fileData) cutExtents(a, e int64) {
	var out []extent
	for _, x := range fd.dirty {
		if x.end <= a || x.off >= e {
			out = append(out, x)
			continue
		}
		if x.off < a {
			out = append(out, extent{x.off, a})
		}
		if x.end > e {
			out = append(out, extent{e, x.end})
		}
	}
	fd.dirty = out
}

func (fd *fileData) clipExtents(n int64) {
	i := fd.extentAfter(n)
	if i < len(fd.dirty) && fd.dirty[i].off < n {
		fd.dirty[i].end = n
		i++
	}
	fd.dirty = fd.dirty[:i]
}

// fileOf loads a file's chunk list on first use.
func (b *branch) fileOf(in *inode) (*fileData, error) {
	if in.f != nil {
		return in.f, nil
	}
	refs, size, err := getFile(b.fs.store, in.id)
	if err != nil {
		return nil, fmt.Errorf("branch %q: %w", b.name, err)
	}
	if size != in.size {
		return nil, fmt.Errorf("branch %q: file object %s: %w: holds %d bytes, entry says %d", b.name, in.id, errCorrupt, size, in.size)
	}
	fd := &fileData{}
	fd.setRefs(refs)
	in.f = fd
	return fd, nil
}

// chunk returns a chunk's bytes (a small cache keeps the recent ones).
func (b *branch) chunk(r fileRef) ([]byte, error) {
	if r.ID.IsZero() {
		return nil, nil
	}
	if d, ok := b.chunkCache[r.ID]; ok {
		return d, nil
	}
	d, err := getChunk(b.fs.store, b.name, r)
	if err != nil {
		return nil, err
	}
	const keep = 16
	if len(b.chunkOrder) >= keep {
		delete(b.chunkCache, b.chunkOrder[0])
		b.chunkOrder = b.chunkOrder[1:]
	}
	b.chunkCache[r.ID] = d
	b.chunkOrder = append(b.chunkOrder, r.ID)
	return d, nil
}

// getChunk reads a chunk of a file of branch name from the store and
// checks its size.
func getChunk(st *chunkstore.Store, name string, r fileRef) ([]byte, error) {
	if r.ID.IsZero() {
		return nil, nil
	}
	d, err := st.Get(r.ID)
	if err != nil {
		return nil, fmt.Errorf("branch %q: read chunk %s: %w", name, r.ID, err)
	}
	if int64(len(d)) != r.Size {
		return nil, fmt.Errorf("branch %q: chunk %s: %w: %d bytes, ref says %d", name, r.ID, errCorrupt, len(d), r.Size)
	}
	return d, nil
}

// readAt reads the file's current content. Caller holds b.mu.
func (b *branch) readAt(in *inode, p []byte, off int64) (int, error) {
	fd, err := b.fileOf(in)
	if err != nil {
		return 0, err
	}
	return fd.readAt(p, off, in.size, func(buf []byte, pos int64) error { return b.ovRead(in, buf, pos) }, b.chunk)
}

// readAt reads the content of a file of size bytes at off: its written
// ranges with written, the rest from its committed chunks, got with
// chunk (nil for a hole).
func (fd *fileData) readAt(p []byte, off, size int64, written func(buf []byte, pos int64) error, chunk func(fileRef) ([]byte, error)) (int, error) {
	if off >= size {
		return 0, io.EOF
	}
	end := min(off+int64(len(p)), size)
	pos := off
	for pos < end {
		buf := p[pos-off : end-off]
		i := fd.extentAfter(pos)
		if i < len(fd.dirty) && fd.dirty[i].off <= pos {
			n := min(end, fd.dirty[i].end) - pos
			if err := written(buf[:n], pos); err != nil {
				return int(pos - off), err
			}
			pos += n
			continue
		}
		next := end
		if i < len(fd.dirty) {
			next = min(next, fd.dirty[i].off)
		}
		if err := fd.readBase(buf[:next-pos], pos, chunk); err != nil {
			return int(pos - off), err
		}
		pos = next
	}
	n := int(end - off)
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// readBase reads the committed chunks at pos (zeros past them).
func (fd *fileData) readBase(buf []byte, pos int64, chunk func(fileRef) ([]byte, error)) error {
	for len(buf) > 0 {
		if pos >= fd.baseLen() {
			clear(buf)
			return nil
		}
		j := sort.Search(len(fd.refs), func(i int) bool { return fd.offs[i+1] > pos })
		d, err := chunk(fd.refs[j])
		if err != nil {
			return err
		}
		in := pos - fd.offs[j]
		n := min(int64(len(buf)), int64(fd.refs[j].Size)-in)
		if d == nil {
			clear(buf[:n])
		} else {
			copy(buf[:n], d[in:in+n])
		}
		buf = buf[n:]
		pos += n
	}
	return nil
}

// write writes p at off, charging len(p) to the quota. Caller holds b.mu.
func (b *branch) write(in *inode, p []byte, off int64) (int, error) {
	if off < 0 || off > maxFileSize-int64(len(p)) {
		return 0, limitErr(syscall.EFBIG, "write of %d bytes at %d passes the largest file size %d", len(p), off, int64(maxFileSize))
	}
	if err := b.charge(int64(len(p))); err != nil {
		return 0, err
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return 0, err
	}
	n, err := b.ovWrite(in, p, off)
	if n > 0 {
		fd.addExtent(off, off+int64(n))
		fd.changed = true
		fd.gen++
		if off+int64(n) > in.size {
			in.size = off + int64(n)
		}
		t := nowNs()
		in.mtime, in.ctime = t, t
		if terr := b.touch(in); err == nil {
			err = terr
		}
	}
	if err != nil {
		return n, fmt.Errorf("branch %q: write inode %d overlay %s: %w", b.name, in.ino, fd.ovPath, err)
	}
	return n, nil
}

// toOverlay copies [a, e) of the file's current content into its overlay
// and marks it written (a few chunks at most: the callers copy the part
// of one chunk that stays when the rest of it goes). Caller holds b.mu.
func (b *branch) toOverlay(in *inode, a, e int64) error {
	if a >= e {
		return nil
	}
	buf := make([]byte, e-a)
	if _, err := b.readAt(in, buf, a); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if _, err := b.ovWrite(in, buf, a); err != nil {
		return fmt.Errorf("branch %q: write inode %d overlay %s: %w", b.name, in.ino, in.f.ovPath, err)
	}
	in.f.addExtent(a, e)
	return nil
}

// truncate sets a file's size, and its mtime and ctime to now even when
// the size stays; growth is charged to the quota as if written, though it
// stores nothing (a hole). Caller holds b.mu.
func (b *branch) truncate(in *inode, n int64) error {
	if n < 0 {
		return limitErr(syscall.EFBIG, "size %d out of range", n)
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return err
	}
	if n == in.size {
		// Nothing to cut or grow, but a truncation (O_TRUNC, ftruncate)
		// marks the file changed all the same, as Linux does: make and its
		// kind compare these times.
		t := nowNs()
		in.mtime, in.ctime = t, t
		return b.touch(in)
	}
	if n < in.size && b.needsLog(fd) {
		if _, err := b.commitRefs(context.Background(), false); err != nil {
			return err
		}
	}
	if n > in.size {
		if err := b.charge(n - in.size); err != nil {
			return err
		}
	} else {
		if n < fd.baseLen() {
			// Cut the base at a chunk boundary; the kept part of the cut
			// chunk moves into the overlay.
			j := sort.Search(len(fd.refs), func(i int) bool { return fd.offs[i+1] > n })
			if !fd.refs[j].ID.IsZero() {
				if err := b.toOverlay(in, fd.offs[j], n); err != nil {
					return err
				}
			}
			fd.setRefs(fd.refs[:j:j])
		}
		fd.clipExtents(n)
		fd.memTruncate(n)
		if fd.ovPath != "" {
			ov, err := b.overlay(in)
			if err != nil {
				return err
			}
			if err := ov.Truncate(n); err != nil {
				return fmt.Errorf("branch %q: truncate overlay %s: %w", b.name, fd.ovPath, err)
			}
		}
	}
	in.size = n
	fd.changed = true
	fd.gen++
	t := nowNs()
	in.mtime, in.ctime = t, t
	return b.touch(in)
}

// punch makes [off, end) of the file a hole without writing zeros: stored
// chunks it covers become holes (the parts of the edge chunks outside it
// move to the overlay), written bytes in it are forgotten. It is never
// refused by the quota and charges nothing. Caller holds b.mu.
func (b *branch) punch(in *inode, off, end int64) error {
	end = min(end, in.size)
	if off < 0 || off >= end {
		return nil
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return err
	}
	if b.needsLog(fd) {
		if _, err := b.commitRefs(context.Background(), false); err != nil {
			return err
		}
	}
	if off < fd.baseLen() {
		i := sort.Search(len(fd.refs), func(k int) bool { return fd.offs[k+1] > off })
		j := sort.Search(len(fd.refs), func(k int) bool { return fd.offs[k] >= end })
		out := append([]fileRef(nil), fd.refs[:i]...)
		for k := i; k < j; k++ {
			r := fd.refs[k]
			if !r.ID.IsZero() {
				if err := b.toOverlay(in, fd.offs[k], off); err != nil {
					return err
				}
				if err := b.toOverlay(in, end, fd.offs[k+1]); err != nil {
					return err
				}
			}
			out = appendHole(out, r.Size)
		}
		fd.setRefs(append(out, fd.refs[j:]...))
	}
	fd.cutExtents(off, end)
	fd.memPunch(off, end)
	if fd.ovPath != "" {
		// Give the overlay's disk space back; the bytes are dead either way.
		if ov, err := b.overlay(in); err == nil {
			unix.Fallocate(int(ov.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, end-off)
		}
	}
	fd.changed = true
	fd.gen++
	t := nowNs()
	in.mtime, in.ctime = t, t
	return b.touch(in)
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

// checkpoint commits the branch, makes it durable and moves the branch
// ref. Every commit is durable (see commitRefs); durable says whether the
// caller needs that (fsync, unmount) or only the id (Head).
func (b *branch) checkpoint(ctx context.Context, durable bool) (chunkstore.ID, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.checkpointLocked(ctx, durable)
}

func (b *branch) checkpointLocked(ctx context.Context, _ bool) (chunkstore.ID, error) {
	return b.commitRefs(ctx, false)
}

// snapshot commits the branch and, in the same ref update, moves its head
// and keeps the result as a snapshot.
func (b *branch) snapshot(ctx context.Context) (chunkstore.ID, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.commitRefs(ctx, true)
}

// commitRefs commits the branch and moves its head ref (with keep also
// the snapshot ref of the new head, and the meta ref when the quota count
// changed) in one UpdateRefs, which makes the new objects durable in the
// same ref log record: one fdatasync. With nothing to update the branch is
// durable already: its head ref was set after its objects were durable.
func (b *branch) commitRefs(ctx context.Context, keep bool) (chunkstore.ID, error) {
	return b.commitWith(ctx, keep, false)
}

// commitWith is commitRefs; with logged, files with many written bytes go
// to the branch's fsync log instead of the store (fsynclog.go).
func (b *branch) commitWith(ctx context.Context, keep, logged bool) (chunkstore.ID, error) {
	if !b.bound() {
		return chunkstore.ID{}, errors.New("commit: mount is not bound to a branch")
	}
	if logged {
		b.logging = &logging{files: map[*fileData]loggedEntry{}}
		defer func() {
			// A logged file is still changed: the next commit stores it.
			for _, in := range b.logging.ins {
				b.dirtyUp(in)
			}
			b.logging = nil
		}()
	}
	id, err := b.commit(ctx)
	if err != nil {
		return id, err
	}
	if logged && len(b.logging.ins) > 0 {
		if err := b.makeLogDurable(); err != nil {
			return id, err
		}
	}
	logUp, newLog, moveLog, err := b.logUpdate(id)
	if err != nil {
		return id, err
	}
	for try := 0; ; try++ {
		var ups []chunkstore.RefUpdate
		if id != b.head {
			ups = append(ups, chunkstore.RefUpdate{Name: refBranch + b.name, Old: b.head, New: id})
		}
		if moveLog {
			ups = append(ups, logUp)
		}
		if b.meta != b.savedMeta {
			up, err := b.fs.metaUpdate(b.name, b.meta)
			if err != nil {
				return id, err
			}
			ups = append(ups, up)
		}
		if keep {
			cur, ok, err := b.fs.getRef(refSnap + id.String())
			if err != nil {
				return id, err
			}
			if !ok || cur != id {
				ups = append(ups, chunkstore.RefUpdate{Name: refSnap + id.String(), Old: cur, New: id})
			}
		}
		if len(ups) == 0 {
			break
		}
		err := b.fs.store.UpdateRefs(ups...)
		if err == nil {
			b.head, b.savedMeta = id, b.meta
			if moveLog {
				b.setLog(newLog)
			}
			return id, nil
		}
		// Only the snapshot ref can change under us (another branch
		// reaching the same tree): read it again.
		if !errors.Is(err, chunkstore.ErrConflict) || !keep || try > 5 {
			return id, fmt.Errorf("branch %q: move head: %w", b.name, err)
		}
	}
	return id, nil
}

// saveMeta writes the branch's settings if they changed. Caller holds b.mu.
func (b *branch) saveMeta() error {
	if b.meta == b.savedMeta {
		return nil
	}
	if err := b.fs.writeMeta(b.name, b.meta); err != nil {
		return fmt.Errorf("branch %q: %w", b.name, err)
	}
	b.savedMeta = b.meta
	return nil
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
	return nil
}
