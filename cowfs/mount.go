package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
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
	b.dropHeld()
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
