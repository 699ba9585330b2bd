package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"tine/internal/quiet"
)

// ErrPoolClosed reports a MountPool used after Close.
var ErrPoolClosed = errors.New("mount pool is closed")

// MountPool keeps FUSE mounts made ahead of time, so that a fork does not
// pay for the mount syscall and the server start. Each pooled mount is a
// placeholder, an empty directory bound to no branch, at its own
// subdirectory of the pool's directory; Mount and Fork bind one to a
// branch in place and a background goroutine mounts a new one. A
// placeholder answers no lookups and refuses changes, so the kernel caches
// nothing from it that could outlive the binding. It is safe for
// concurrent use.
type MountPool struct {
	fs   *FS
	dir  string
	n    int
	opts MountOptions

	ready chan *pooled  // unbound placeholders, at most n
	kick  chan struct{} // asks the refill loop to top the pool up
	stop  chan struct{} // closed by Close
	done  chan struct{} // closed when the refill loop has returned

	mu     sync.Mutex
	seq    int   // last subdirectory number tried
	err    error // the refill loop's last failure, cleared by a success
	closed bool
}

// NewMountPool mounts n placeholders under dir, each at its own
// subdirectory, and keeps n ready as they are taken. dir is created with
// mode 0700 if missing; an existing dir must belong to this user and be
// closed to others (mode 0700), unless opts.AllowOther is set. opts
// applies to every mount of the pool, as in Mount. On error nothing stays
// mounted.
func (f *FS) NewMountPool(ctx context.Context, dir string, n int, opts *MountOptions) (*MountPool, error) {
	if n < 1 {
		return nil, fmt.Errorf("mount pool at %s: size %d, want at least 1", dir, n)
	}
	if opts == nil {
		opts = &MountOptions{}
	}
	if err := poolDir(dir, opts.AllowOther); err != nil {
		return nil, err
	}
	p := &MountPool{fs: f, dir: dir, n: n, opts: *opts,
		ready: make(chan *pooled, n), kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	p.dropStale()
	for i := 0; i < n; i++ {
		var m *pooled
		err := ctx.Err()
		if err == nil {
			m, err = p.newPlaceholder()
		}
		if err != nil {
			close(p.done)
			p.Close()
			return nil, fmt.Errorf("mount pool at %s: %w", dir, err)
		}
		p.ready <- m
	}
	go p.refill()
	return p, nil
}

// poolDir makes dir private to this user, or checks that it is.
func poolDir(dir string, shared bool) error {
	err := os.Mkdir(dir, 0o700)
	if err == nil || shared {
		return nil
	}
	if !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("mount pool: create %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("mount pool: %w", err)
	}
	return checkPrivateDir("mount pool dir", dir, &st, 0o077)
}

// Dir returns the directory the pool's mounts are made under.
func (p *MountPool) Dir() string { return p.dir }

// Ready returns how many placeholders are mounted and waiting.
func (p *MountPool) Ready() int { return len(p.ready) }

// Fork creates branch name from snapshot snap and serves it from a pooled
// mount, as Mount does. The branch is made as BranchManyDeferred makes it:
// it is durable with its first commit (or any other durable update of the
// store), and a crash before that loses the fork, which held nothing but
// its snapshot. If the branch cannot be served it is deleted again.
func (p *MountPool) Fork(ctx context.Context, snap SnapshotID, name string) (*Mount, error) {
	if err := p.fs.BranchManyDeferred(ctx, snap, []string{name}); err != nil {
		return nil, err
	}
	m, err := p.Mount(ctx, name)
	if err != nil {
		if derr := p.fs.DeleteBranch(ctx, name); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, fmt.Errorf("fork %q from %s: %w", name, snap, err)
	}
	return m, nil
}

// Mount serves the existing branch name from a pooled mount: the returned
// Mount behaves as one made by (*FS).Mount (the branch lock is held until
// Unmount), at a subdirectory of the pool's directory. The directory stays
// after Unmount. A branch already mounted fails with ErrBusy. With no
// placeholder ready, one is mounted on the spot.
func (p *MountPool) Mount(ctx context.Context, name string) (*Mount, error) {
	if err := checkName("branch", name); err != nil {
		return nil, err
	}
	f := p.fs
	if err := f.reserve(name); err != nil {
		return nil, err
	}
	release := func() {
		f.mu.Lock()
		delete(f.live, name)
		f.mu.Unlock()
	}
	pm, err := p.take(ctx)
	if err != nil {
		release()
		return nil, fmt.Errorf("mount %q from pool %s: %w", name, p.dir, err)
	}
	m, b := pm.m, pm.m.b
	b.mu.Lock()
	used, err := b.open(name, pm.pre)
	b.mu.Unlock()
	if used {
		pm.pre = nil
	}
	if err != nil {
		release()
		p.put(pm)
		return nil, fmt.Errorf("mount %q at %s: %w", name, m.dir, err)
	}
	f.mu.Lock()
	f.live[name] = b
	f.mu.Unlock()
	// The root's attributes may sit in the kernel's cache from before the
	// binding: drop them. The kernel also ignores replies to requests that
	// began before this.
	b.rootNode.NotifyContent(0, 0)
	pm.pre.drop()
	p.wake()
	return m, nil
}

// Close stops refilling and unmounts the placeholders still waiting, and
// removes their directories. Mounts already handed out stay mounted.
func (p *MountPool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	var errs []error
	for len(p.ready) > 0 {
		errs = append(errs, p.discard(<-p.ready))
	}
	return errors.Join(errs...)
}

// pooled is a placeholder mount with the spare state directory made for
// it (nil once used).
type pooled struct {
	m   *Mount
	pre *stateDir
}

// take returns a placeholder: a ready one, or else one mounted now. The
// refill starts after the binding, so that it does not compete with it.
func (p *MountPool) take(ctx context.Context) (*pooled, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrPoolClosed
	}
	for {
		var pm *pooled
		select {
		case pm = <-p.ready:
		default:
		}
		if pm == nil {
			break
		}
		select {
		case <-pm.m.served:
			// Unmounted from outside: drop it and try the next.
			p.discard(pm)
			p.wake()
			continue
		default:
		}
		return pm, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return p.newPlaceholder()
}

// put returns an unbound placeholder to the pool, or unmounts it when the
// pool is full or closed.
func (p *MountPool) put(m *pooled) {
	// Sending under p.mu orders it before Close's drain.
	p.mu.Lock()
	kept := false
	if !p.closed {
		select {
		case p.ready <- m:
			kept = true
		default:
		}
	}
	p.mu.Unlock()
	if !kept {
		p.discard(m)
	}
}

func (p *MountPool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// refillDelay is how long the refill waits after the last take, while
// other mounts are still ready, before it mounts a replacement: a fork
// into many takes several at once.
const refillDelay = 50 * time.Millisecond

// refillMax bounds that wait when mounts keep being taken, and the wait
// for a quiet host before each replacement: a mount (its FUSE server
// threads, INIT, buffers) competes for CPU with the sandbox just bound
// and its first command (docs/adr/0194).
const refillMax = 250 * time.Millisecond

// refill mounts placeholders whenever the pool is below its size. It is
// the only sender on p.ready besides put, which never blocks.
func (p *MountPool) refill() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		// Wait until no mount was taken for refillDelay, unless the pool
		// is dry (the next take would mount on the spot).
		limit := time.After(refillMax)
		for quiet := false; !quiet && len(p.ready) > 0; {
			select {
			case <-p.stop:
				return
			case <-p.kick:
			case <-time.After(refillDelay):
				quiet = true
			case <-limit:
				quiet = true
			}
		}
		for len(p.ready) < p.n {
			// A dry pool refills at once: the next take would mount on
			// the spot.
			if len(p.ready) > 0 && !quiet.Wait(p.stop, refillMax) {
				return
			}
			select {
			case <-p.stop:
				return
			default:
			}
			m, err := p.newPlaceholder()
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
			if err != nil {
				break // the next take tries again, and mounts on the spot
			}
			select {
			case p.ready <- m:
			default:
				p.discard(m) // filled by put meanwhile
			}
		}
	}
}

// Err returns the background refill's last failure, or nil.
func (p *MountPool) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// newPlaceholder mounts an unbound branch at a fresh subdirectory and
// makes a spare state directory for it.
func (p *MountPool) newPlaceholder() (*pooled, error) {
	pre, err := p.newStateDir()
	if err != nil {
		return nil, err
	}
	dir, err := p.newDir()
	if err != nil {
		pre.drop()
		return nil, err
	}
	m, err := p.fs.serve(p.fs.newBranch(), dir, "tine:pool", &p.opts)
	if err != nil {
		pre.drop()
		os.Remove(dir)
		return nil, fmt.Errorf("mount placeholder at %s: %w", dir, err)
	}
	return &pooled{m: m, pre: pre}, nil
}

// sparePrefix starts the names of spare state directories; the leading dot keeps them
// apart from branch names.
const sparePrefix = ".spare-"

// newStateDir makes a spare branch state directory with its lock taken.
func (p *MountPool) newStateDir() (*stateDir, error) {
	d, err := os.MkdirTemp(filepath.Join(p.fs.root, "branches"), sparePrefix)
	if err != nil {
		return nil, fmt.Errorf("make spare branch dir: %w", err)
	}
	if err := os.Chmod(d, 0o700); err != nil {
		os.Remove(d)
		return nil, fmt.Errorf("make spare branch dir %s: %w", d, err)
	}
	lk, err := lockFile(filepath.Join(d, "lock"))
	if err != nil {
		os.RemoveAll(d)
		return nil, fmt.Errorf("make spare branch dir %s: %w", d, err)
	}
	return &stateDir{path: d, lock: lk}, nil
}

// drop releases and removes an unused spare state directory.
func (s *stateDir) drop() {
	if s == nil {
		return
	}
	s.lock.Close()
	os.RemoveAll(s.path)
}

// dropStale removes spare state directories left by a process that ended
// without closing its pool (their locks are free).
func (p *MountPool) dropStale() {
	olds, _ := filepath.Glob(filepath.Join(p.fs.root, "branches", sparePrefix+"*"))
	for _, d := range olds {
		lk, err := lockFile(filepath.Join(d, "lock"))
		if err != nil {
			continue // in use by a live pool, or not ours to judge
		}
		lk.Close()
		os.RemoveAll(d)
	}
}

// newDir makes an empty subdirectory for a mount. A leftover empty one is
// reused; one that cannot be removed (a mount point) is skipped.
func (p *MountPool) newDir() (string, error) {
	for try := 0; try < 1000; try++ {
		p.mu.Lock()
		p.seq++
		d := filepath.Join(p.dir, strconv.Itoa(p.seq))
		p.mu.Unlock()
		err := os.Mkdir(d, 0o700)
		if errors.Is(err, os.ErrExist) && os.Remove(d) == nil {
			err = os.Mkdir(d, 0o700)
		}
		if err == nil {
			return d, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("create mount dir %s: %w", d, err)
		}
	}
	return "", fmt.Errorf("create mount dir in %s: no free name", p.dir)
}

// discard unmounts an unbound placeholder, removes its directory and
// drops its spare state directory.
func (p *MountPool) discard(pm *pooled) error {
	pm.pre.drop()
	m := pm.m
	if err := m.Unmount(); err != nil {
		return err
	}
	if err := os.Remove(m.dir); err != nil {
		return fmt.Errorf("remove placeholder dir %s: %w", m.dir, err)
	}
	return nil
}
