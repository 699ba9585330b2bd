package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"tine/cowfs/internal/fuseuring"
)

// Mount is a branch served over FUSE at a directory.
type Mount struct {
	fs     *FS
	b      *branch
	dir    string
	server *fuse.Server
	ring   *fuseuring.Conn // nil when served over /dev/fuse alone
	served chan struct{}   // closed when the server has stopped
	once   sync.Once
	err    error
}

// Mount serves branch at dir (an existing empty directory) until Unmount.
// A branch can be mounted once at a time; a second attempt fails with
// ErrBusy naming the process that holds it. On error nothing stays
// mounted at dir.
func (f *FS) Mount(ctx context.Context, branchName, dir string, opts *MountOptions) (*Mount, error) {
	if opts == nil {
		opts = &MountOptions{}
	}
	if err := f.reserve(branchName); err != nil {
		return nil, err
	}
	b, err := f.openBranch(branchName)
	if err != nil {
		f.mu.Lock()
		delete(f.live, branchName)
		f.mu.Unlock()
		return nil, err
	}
	m, err := f.serve(b, dir, "tine:"+branchName, opts)
	if err != nil {
		b.close()
		f.mu.Lock()
		delete(f.live, branchName)
		f.mu.Unlock()
		return nil, fmt.Errorf("mount %q at %s: %w", branchName, dir, err)
	}
	f.mu.Lock()
	f.live[branchName] = b
	f.mu.Unlock()
	return m, nil
}

// reserve marks branch name as being mounted in this process, or fails
// with ErrBusy if it is mounted already.
func (f *FS) reserve(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[name]; ok {
		return fmt.Errorf("mount %q: %w by %s", name, ErrBusy, describeProcess(os.Getpid()))
	}
	f.live[name] = nil // reserved while mounting
	return nil
}

// serve mounts b's root at dir and serves it until unmounted. b may be
// unbound (a pooled placeholder) and be bound later. On error nothing is
// mounted.
func (f *FS) serve(b *branch, dir, fsName string, opts *MountOptions) (*Mount, error) {
	dir, err := checkMountpoint(dir)
	if err != nil {
		return nil, err
	}
	b.passthrough = !opts.NoPassthrough && os.Geteuid() == 0
	b.keepCache = !opts.NoKeepCache
	b.backings = f.newBackings()
	root := &node{b: b, in: b.root}
	b.rootNode = root
	b.mountDir = dir
	srv, conn, id, err := mountFUSE(dir, root, b.backings, fuseOptions(fsName+"@"+f.tag, opts), !opts.NoURing)
	if err != nil {
		b.backings.forget()
		return nil, err
	}
	m := &Mount{fs: f, b: b, dir: dir, server: srv, ring: conn, served: make(chan struct{})}
	go func() {
		srv.Wait()
		if conn != nil {
			// Requests on the rings end with the connection.
			select {
			case <-conn.Ended():
			case <-time.After(ringEndTimeout):
			}
		}
		guardRemove(id)
		b.backings.forget()
		close(m.served)
	}()
	return m, nil
}

// checkMountpoint returns dir made absolute and free of symlinks, as
// mountinfo shows it, if it is a directory one can mount on.
func checkMountpoint(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if deadFUSE(abs) {
		return "", fmt.Errorf("%s is a dead FUSE mount (its server has exited): run fusermount3 -u %s", abs, abs)
	}
	var st unix.Stat_t
	switch err := unix.Stat(abs, &st); {
	case err != nil:
		return "", fmt.Errorf("mount point %s: %w", abs, err)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return "", fmt.Errorf("mount point %s: not a directory", abs)
	}
	return filepath.EvalSymlinks(abs)
}

// mountFUSE mounts root at dir, its requests served over io_uring
// when the kernel offers it and ring is set (ADR 0181). If the mount is
// made but the server then fails to start (dir swapped for a file
// meanwhile, or the kernel refused the handshake), the mount is detached
// again: a failed mount leaves nothing behind.
func mountFUSE(dir string, root gofs.InodeEmbedder, bk *backings, fo *gofs.Options, ring bool) (*fuse.Server, *fuseuring.Conn, uint32, error) {
	srv, conn, id, err := startFUSE(dir, root, bk, fo, ring)
	if err == nil {
		cloexecDevice(srv) // cloexec.go
		return srv, conn, id, nil
	}
	guardRemove(id)
	// The top mount at dir with our exact source is the one just made: an
	// earlier mount with that source would be of the same branch (refused
	// by its lock before we got here), a dead one (refused by
	// checkMountpoint) or a pool placeholder (whose directory is new).
	for {
		m, lerr := topMount(dir, fo.FsName)
		if lerr != nil {
			return nil, nil, 0, errors.Join(err, lerr)
		}
		if m == nil {
			return nil, nil, 0, err
		}
		if uerr := unix.Unmount(dir, unix.MNT_DETACH); uerr != nil {
			return nil, nil, 0, errors.Join(err, fmt.Errorf("detach failed mount: %w; run: fusermount3 -u %s", uerr, dir))
		}
	}
}

// topMount returns the top mount at dir when it is ours with source
// fsName, nil otherwise.
func topMount(dir, fsName string) (*mountEntry, error) {
	ms, err := mountsAt(dir)
	if err != nil || len(ms) == 0 {
		return nil, err
	}
	if m := ms[len(ms)-1]; m.fsType == fuseType && m.source == fsName {
		return &m, nil
	}
	return nil, nil
}

// initTimeout bounds the wait for the kernel's INIT of a new mount.
const initTimeout = 30 * time.Second

// startFUSE mounts and starts serving, over io_uring when ring is set
// and the kernel offers it. The connection is nil when it is served over
// /dev/fuse alone. id is the FUSE connection's number when the guard was
// told of it (guard.go), 0 otherwise; it is set on error too.
func startFUSE(dir string, root gofs.InodeEmbedder, bk *backings, fo *gofs.Options, ring bool) (srv *fuse.Server, conn *fuseuring.Conn, id uint32, err error) {
	var raw fuse.RawFileSystem = rawFS{gofs.NewNodeFS(root, fo), bk}
	mo := fo.MountOptions
	var fs fuse.RawFileSystem = raw
	var hook *fuseuring.InitHook
	if ring && fuseuring.Enabled() && fuseuring.Prepare() == nil {
		mo.ExtraCapabilities |= fuse.CAP_OVER_IO_URING
		hook = fuseuring.NewInitHook(raw)
		fs = hook
	}
	if srv, err = fuse.NewServer(fs, dir, &mo); err != nil {
		return nil, nil, 0, err
	}
	bk.set.mu.Lock()
	bk.srv = srv
	bk.set.mu.Unlock()
	// Before anything of this process touches the mount (WaitMount does).
	if guarded() {
		if m, _ := topMount(dir, mo.FsName); m != nil {
			id = m.minor
			guardAdd(id, mo.FsName)
		}
	}
	go srv.Serve()
	if hook != nil {
		select {
		case <-hook.Inited():
		case <-time.After(initTimeout):
			return nil, nil, id, fmt.Errorf("mount %s: no FUSE INIT from the kernel in %v", dir, initTimeout)
		}
		// On error the kernel goes on over /dev/fuse.
		conn, _ = fuseuring.Attach(srv, raw, &mo)
	}
	// go-fuse's WaitMount opens a file of the new mount without
	// O_CLOEXEC (its poll hack): a program that another thread of this
	// process started meanwhile would inherit it and keep the mount busy,
	// and its connection alive, for as long as it lives (an unmount then
	// waits forever). Forks wait for it, as for Go's own such opens.
	syscall.ForkLock.RLock()
	err = srv.WaitMount()
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, id, err
	}
	return srv, conn, id, nil
}

// ringEndTimeout bounds the wait, after an unmount, for the kernel to
// give back a connection's ring entries.
const ringEndTimeout = 10 * time.Second

// Transport names how the mount's requests reach its server: "io_uring"
// or "/dev/fuse".
func (m *Mount) Transport() string {
	if m.ring != nil && m.ring.Live() {
		return "io_uring"
	}
	return "/dev/fuse"
}

// Dir returns the mount point.
func (m *Mount) Dir() string { return m.dir }

// Branch returns the mounted branch's name.
func (m *Mount) Branch() string { return m.b.name }

// Wait blocks until the filesystem is unmounted (by Unmount or from outside).
func (m *Mount) Wait() { <-m.served }

// Unmount detaches the mount, commits the branch durably and releases it.
func (m *Mount) Unmount() error {
	m.once.Do(func() {
		var err error
		select {
		case <-m.served: // unmounted from outside already
		default:
			err = m.server.Unmount()
		}
		if err != nil {
			// Busy: detach lazily so the branch can still be released.
			if uerr := unix.Unmount(m.dir, unix.MNT_DETACH); uerr == nil {
				err = nil
			}
		}
		<-m.served
		m.b.mu.Lock()
		bound := m.b.bound()
		m.b.mu.Unlock()
		if !bound {
			// A pooled placeholder: no branch to commit or release.
			if err != nil {
				m.err = fmt.Errorf("unmount placeholder %s: %w", m.dir, err)
			}
			return
		}
		_, cerr := m.b.checkpoint(context.Background(), true)
		m.b.close()
		m.fs.mu.Lock()
		delete(m.fs.live, m.b.name)
		m.fs.mu.Unlock()
		m.err = errors.Join(err, cerr)
		if m.err != nil {
			m.err = fmt.Errorf("unmount %q from %s: %w", m.b.name, m.dir, m.err)
		}
	})
	return m.err
}

func (b *branch) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closeLocked()
}

// closeLocked is close for a caller that holds b.mu or owns b alone.
func (b *branch) closeLocked() {
	b.walkLoaded(b.root, func(in *inode) {
		if in.f != nil {
			b.dropOverlay(in.f)
		}
	})
	for _, in := range b.orphans {
		b.dropOverlay(in.f)
	}
	b.orphans = nil
	b.removals.drain()
	// Overlay files the fsync log still needs stay for the next open.
	b.pend = nil
	if b.behind != nil {
		b.behind.Stop()
		b.behind = nil
	}
	if b.lock != nil {
		b.lock.Close()
		b.lock = nil
	}
}

// walkLoaded calls fn on every loaded inode under top (a file once per
// name). It walks with a stack of its own, so a tree of any depth works.
func (b *branch) walkLoaded(top *inode, fn func(*inode)) {
	stack := []*inode{top}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		fn(d)
		for _, c := range d.children {
			if c.typ == TypeDir {
				stack = append(stack, c)
			} else {
				fn(c)
			}
		}
	}
}

// lockFile takes an exclusive, non-blocking flock on path and writes our
// pid into it, so that a refused locker can name the holder.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w by %s (lock %s)", ErrBusy, lockHolder(path), path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Best effort: without it the holder is reported as unknown.
	if f.Truncate(0) == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

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

// handle is an open file.
type handle struct {
	n    *node
	in   *inode
	bk   *backing // the backing file the kernel serves it with (kinds 1 and 2)
	kind int      // 0 plain, 1 passthrough, 2 direct
	keep bool     // a plain open keeps the kernel's page cache
	// writer: opened for writing, so it may back a shared writable
	// mapping, whose dirty pages the kernel holds (see flushMapped)
	writer bool
}

// newHandle makes the handle of an open of in with flags and counts it
// among the branch's writers if it may write. Caller holds b.mu.
func (b *branch) newHandle(n *node, in *inode, flags uint32, keep bool) *handle {
	h := &handle{n: n, in: in, keep: keep, writer: flags&syscall.O_ACCMODE != syscall.O_RDONLY}
	if h.writer {
		b.writing[in]++
	}
	return h
}

var _ gofs.FileReleaser = (*handle)(nil)

func (h *handle) Release(ctx context.Context) syscall.Errno {
	b := h.n.b
	b.mu.Lock()
	if put := b.release(h); put != nil {
		b.put(h.n, put)
	}
	b.mu.Unlock()
	return 0
}

// release forgets handle h and returns the content to put in the kernel's
// page cache, if any (pagestore.go). Caller holds b.mu.
func (b *branch) release(h *handle) []byte {
	h.in.opens--
	if h.writer {
		if b.writing[h.in]--; b.writing[h.in] <= 0 {
			delete(b.writing, h.in)
		}
	}
	if h.kind != 1 {
		h.in.cachedOpens--
	}
	if h.bk != nil {
		h.in.backedOpens--
		if h.in.backedOpens == 0 {
			h.in.bk = nil
		}
		b.backings.release(h.bk)
	}
	// An unlinked file, or one a rollback took out of the tree, is gone
	// at its last close.
	if h.in.opens == 0 && h.in.f != nil && (h.in.nlink == 0 || b.orphans[h.in] != nil) {
		b.dropOverlay(h.in.f)
		delete(b.orphans, h.in)
	}
	if h.writer && h.n.in == h.in {
		return b.putStart(h.n, releasePutMax)
	}
	return nil
}

// passthroughMin is the smallest file read through passthrough. A
// smaller one is read through the server into the mount's page cache,
// which every later open keeps: its first open would otherwise write a
// cache file, a host create that costs more than all the READ requests
// of a file this small (ADR 0202).
const passthroughMin = 64 << 10

// backedWait bounds how long a writable open waits for the release of
// the file's last handle with a backing file (see Open).
const backedWait = 100 * time.Millisecond

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	b := n.b
	writable := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	b.mu.Lock()
	in := n.cur()
	if in.typ != TypeFile {
		b.mu.Unlock()
		return nil, 0, 0
	}
	if b.waitPut(in) {
		in = n.cur()
	}
	if !writable {
		if data := b.putStart(n, openPutMax); data != nil {
			b.put(n, data)
			in = n.cur()
		}
	}
	if writable && in.backedOpens > 0 {
		// The kernel gives every open of an inode the backing file of its
		// passthrough opens, reopened with the new open's flags, and maps
		// the file through it: a writable open would let a shared mapping
		// write into the cache file every branch reads (ADR 0052). So a
		// writable open waits for the release of those handles, which may
		// be on its way (the kernel sends it after close returns), and is
		// refused if they stay open.
		deadline := time.Now().Add(backedWait)
		for in.backedOpens > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
			b.mu.Unlock()
			time.Sleep(time.Millisecond)
			b.mu.Lock()
			in = n.cur()
		}
		if in.backedOpens > 0 {
			b.mu.Unlock()
			return nil, 0, syscall.ETXTBSY
		}
	}
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		if err := b.truncate(in, 0); err != nil {
			b.mu.Unlock()
			return nil, 0, toErrno(err)
		}
	}
	h := b.newHandle(n, in, flags, b.keepCache)
	// A passthrough open while the file is unchanged, big enough (see
	// passthroughMin) and no cached open exists (the kernel allows one
	// kind at a time), with the backing of the passthrough opens there
	// are.
	unchanged := func() bool { return in.f == nil || !in.f.changed }
	if !writable && b.passthrough && in.cachedOpens == 0 && unchanged() && !in.id.IsZero() && in.size >= passthroughMin &&
		(in.bk == nil || in.bk.id == in.id) && requestKey(ctx) != nil {
		id, size := in.id, in.size
		b.mu.Unlock()
		bk, err := b.backings.acquire(ctx, b.fs, id, size)
		b.mu.Lock()
		if err == nil && in.id == id && unchanged() && in.cachedOpens == 0 && (in.bk == nil || in.bk == bk) {
			h.bk, h.kind = bk, 1
		} else if bk != nil {
			b.backings.release(bk)
		}
	}
	var fl uint32
	if h.kind == 0 && in.backedOpens > 0 && !writable {
		// The kernel refuses any open but a passthrough one, with the
		// same backing file, while passthrough opens exist; direct I/O
		// then sends its reads to cowfs.
		h.kind, h.bk = 2, in.bk
		b.backings.hold(h.bk)
		fl = fuse.FOPEN_DIRECT_IO
	}
	in.opens++
	if h.kind != 1 {
		in.cachedOpens++
	}
	if h.bk != nil {
		in.backedOpens++
		in.bk = h.bk
		b.backings.pass(ctx, h.bk.bid)
	}
	b.mu.Unlock()
	// Never a backing file for a writable open (see above). A plain open
	// keeps the page cache across opens: every change of the file's bytes
	// goes through this mount, or replaces the inode (rollback).
	return h, fl | h.openFlags(), 0
}

// openFlags are the FOPEN_ flags of every open: no FLUSH request at
// close (cowfs has nothing to do then; data reaches the branch with each
// write and is committed by fsync), and, unless NoKeepCache, the page
// cache kept across opens.
func (h *handle) openFlags() uint32 {
	fl := uint32(fuse.FOPEN_NOFLUSH)
	if h.keep && h.kind == 0 {
		fl |= fuse.FOPEN_KEEP_CACHE
	}
	return fl
}

// handleOf returns the handle behind fh, or nil.
func handleOf(fh gofs.FileHandle) *handle {
	h, _ := fh.(*handle)
	return h
}

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

// readTestHook, when set (by tests), runs as a READ is served, with the
// branch's name.
var readTestHook atomic.Pointer[func(branch string)]

func (n *node) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	b := n.b
	if hook := readTestHook.Load(); hook != nil {
		(*hook)(b.name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	if h := handleOf(fh); h != nil {
		in = h.in
	}
	m, err := b.readAt(in, dest, off)
	if err != nil && m == 0 && off < in.size {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:m]), 0
}

func (n *node) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	if h := handleOf(fh); h != nil {
		in = h.in
	}
	w, err := b.write(in, data, off)
	if w > 0 {
		n.paged = false
	}
	if err != nil && w == 0 {
		return 0, toErrno(err)
	}
	return uint32(w), 0
}

// fsyncTestHook, when set (by tests), runs as an fsync is served.
var fsyncTestHook atomic.Pointer[func()]

func (n *node) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	if hook := fsyncTestHook.Load(); hook != nil {
		(*hook)()
	}
	if err := n.b.sync(context.Background()); err != nil {
		return syscall.EIO
	}
	return 0
}

func (n *node) Allocate(ctx context.Context, fh gofs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	if in.typ != TypeFile {
		return syscall.ENODEV
	}
	if off > maxFileSize || size > maxFileSize-off {
		return syscall.EFBIG
	}
	end := int64(off + size)
	n.paged = false // the kernel drops a punched range's pages
	switch mode {
	case 0:
		if end > in.size {
			return toErrno(b.truncate(in, end))
		}
		return 0
	case unix.FALLOC_FL_KEEP_SIZE:
		return 0
	case unix.FALLOC_FL_KEEP_SIZE | unix.FALLOC_FL_PUNCH_HOLE:
		return toErrno(b.punch(in, int64(off), end))
	}
	return syscall.EOPNOTSUPP
}

func (n *node) Lseek(ctx context.Context, fh gofs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	if h := handleOf(fh); h != nil {
		in = h.in
	}
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return 0, syscall.EINVAL
	}
	if in.typ != TypeFile || int64(off) >= in.size {
		return 0, syscall.ENXIO
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return 0, syscall.EIO
	}
	pos, ok := fd.seek(int64(off), in.size, whence == unix.SEEK_DATA)
	if !ok {
		return 0, syscall.ENXIO
	}
	return uint64(pos), 0
}

// isData reports whether the byte at pos holds data (written, or inside a
// stored chunk) and where that state ends.
func (fd *fileData) isData(pos, size int64) (bool, int64) {
	end := size
	i := fd.extentAfter(pos)
	if i < len(fd.dirty) {
		if fd.dirty[i].off <= pos {
			return true, fd.dirty[i].end
		}
		end = fd.dirty[i].off // a written range starts here at the latest
	}
	if pos < fd.baseLen() {
		j := sort.Search(len(fd.refs), func(k int) bool { return fd.offs[k+1] > pos })
		if !fd.refs[j].ID.IsZero() {
			return true, fd.offs[j+1]
		}
		return false, min(end, fd.offs[j+1])
	}
	return false, end
}

// seek finds the next data (or hole) at or after pos; the end of the file
// counts as a hole.
func (fd *fileData) seek(pos, size int64, data bool) (int64, bool) {
	for pos < size {
		d, end := fd.isData(pos, size)
		if d == data {
			return pos, true
		}
		pos = end
	}
	if data {
		return 0, false
	}
	return size, true
}

// Statfs reports the space the branch can still take: the free space of
// the disk holding the store, and within it the quota's remainder when
// the branch has a quota.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	b := n.b
	const bs = 4096
	total, free := uint64(1)<<50, uint64(1)<<50
	var st unix.Statfs_t
	if unix.Statfs(b.fs.root, &st) == nil {
		total, free = st.Blocks*uint64(st.Bsize), st.Bavail*uint64(st.Bsize)
	}
	b.mu.Lock()
	q, used := b.meta.QuotaBytes, b.meta.UsedBytes
	b.mu.Unlock()
	if q > 0 {
		total = uint64(q)
		free = min(free, uint64(max(q-used, 0)))
	}
	out.Bsize, out.Frsize = bs, bs
	out.Blocks, out.Bfree, out.Bavail = total/bs, free/bs, free/bs
	out.Files, out.Ffree = 1<<40, 1<<40
	out.NameLen = 255
	return 0
}

// xattrNamespaces are the xattr namespaces cowfs keeps.
var xattrNamespaces = []string{"user.", "trusted.", "security."}

func xattrAllowed(name string) bool {
	for _, p := range xattrNamespaces {
		if len(name) > len(p) && name[:len(p)] == p {
			return true
		}
	}
	return false
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := n.cur().xattrs[attr]
	if !ok {
		return 0, syscall.ENODATA
	}
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if slices.Contains(xattrNamespaces, attr) {
		return syscall.EINVAL // a namespace with no name in it, as Linux answers
	}
	if !xattrAllowed(attr) {
		return syscall.EOPNOTSUPP
	}
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.bound() {
		return syscall.EROFS
	}
	if data == nil {
		data = []byte{}
	}
	return toErrno(b.setXattr(n.cur(), attr, data, flags))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.bound() {
		return syscall.EROFS
	}
	return toErrno(b.setXattr(n.cur(), attr, nil, 0))
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	names := make([]string, 0, len(in.xattrs))
	for k := range in.xattrs {
		names = append(names, k)
	}
	sort.Strings(names)
	var buf []byte
	for _, k := range names {
		buf = append(append(buf, k...), 0)
	}
	if len(dest) == 0 {
		return uint32(len(buf)), 0
	}
	if len(dest) < len(buf) {
		return uint32(len(buf)), syscall.ERANGE
	}
	return uint32(copy(dest, buf)), 0
}

// notifyRollback drops the kernel's cached names and attributes after the
// branch switched to another tree.
func (b *branch) notifyRollback(names []string) {
	r := b.rootNode
	if r == nil {
		return
	}
	for _, name := range names {
		r.NotifyEntry(name)
	}
	r.NotifyContent(0, 0)
}
