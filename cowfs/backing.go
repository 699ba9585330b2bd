package cowfs

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"tine/chunkstore"
)

// Passthrough opens are served from a backing file registered with the
// mount's FUSE connection (FUSE_DEV_IOC_BACKING_OPEN). A registration is
// made once per content id and mount, and kept after its last handle is
// released, so that opening the same unchanged file again costs no open,
// lock or ioctl of the cache file (ADR 0188). The kernel holds the cache
// file open for as long as the registration or any passthrough open
// lasts, and with it the shared flock taken when the file was opened
// (cache.go): eviction passes over it until the idle registration is
// dropped.

// maxIdleBackings bounds the registrations with no open handle, over
// every mount of an FS; the least recently used go first. Each holds an
// open file in the kernel (a few hundred bytes), not a descriptor of
// this process.
var maxIdleBackings = 16384

// backingSet is an FS's registrations, over all its mounts.
type backingSet struct {
	mu     sync.Mutex
	idle   list.List // of *backing with no handle, least recently used first
	tables map[*backings]bool
}

// backings are one mount's registrations.
type backings struct {
	set  *backingSet  // its mu guards srv, off and byID
	srv  *fuse.Server // set before the mount serves
	off  bool         // the kernel refused a registration: none is tried again
	byID map[chunkstore.ID]*backing

	pmu     sync.Mutex                // guards pending: every OPEN of the mount looks there
	pending map[<-chan struct{}]int32 // backing id chosen by Open, by request (see rawFS.Open)
}

// backing is one registration.
type backing struct {
	t       *backings
	id      chunkstore.ID
	bid     int32         // the kernel's backing id
	handles int           // open handles served with it
	idle    *list.Element // in set.idle when handles == 0
	used    time.Time     // when the cache file's mtime was last set to mark its use
}

// newBackings makes the registration table of a mount about to be made.
func (f *FS) newBackings() *backings {
	s := &f.backings
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tables == nil {
		s.tables = map[*backings]bool{}
	}
	t := &backings{set: s, byID: map[chunkstore.ID]*backing{}, pending: map[<-chan struct{}]int32{}}
	s.tables[t] = true
	return t
}

// errNoBacking reports a mount that cannot register backing files.
var errNoBacking = errors.New("backing files are not available on this mount")

// acquire returns the registration of content id (size bytes), making
// the cache file and the registration if needed, with one more handle.
func (t *backings) acquire(ctx context.Context, f *FS, id chunkstore.ID, size int64) (*backing, error) {
	s := t.set
	s.mu.Lock()
	if e := t.byID[id]; e != nil {
		t.holdLocked(e)
		touch := time.Since(e.used) > useGrain
		if touch {
			e.used = time.Now()
		}
		s.mu.Unlock()
		if touch {
			markUsed(f.cacheFilePath(id))
		}
		return e, nil
	}
	if t.off || t.srv == nil {
		s.mu.Unlock()
		return nil, errNoBacking
	}
	srv := t.srv
	s.mu.Unlock()

	fh, err := f.cacheFile(ctx, id, size)
	if err != nil {
		return nil, err
	}
	// The kernel takes its own reference to the open file, and with it
	// the shared lock; this descriptor is not needed after.
	bid, errno := srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fh.Fd())})
	fh.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if errno != 0 {
		if errno == syscall.EPERM || errno == syscall.ENOTTY || errno == syscall.EINVAL {
			t.off = true
		}
		return nil, fmt.Errorf("register backing file %s: %w", id, errno)
	}
	if e := t.byID[id]; e != nil || !s.tables[t] {
		// Another open registered it meanwhile, or the mount is gone.
		srv.UnregisterBackingFd(bid)
		if e == nil {
			return nil, errNoBacking
		}
		t.holdLocked(e)
		return e, nil
	}
	e := &backing{t: t, id: id, bid: bid, handles: 1, used: time.Now()}
	t.byID[id] = e
	return e, nil
}

// hold counts one more handle of e.
func (t *backings) hold(e *backing) {
	t.set.mu.Lock()
	t.holdLocked(e)
	t.set.mu.Unlock()
}

// holdLocked is hold for a caller that holds set.mu.
func (t *backings) holdLocked(e *backing) {
	if e.idle != nil {
		t.set.idle.Remove(e.idle)
		e.idle = nil
	}
	e.handles++
}

// release counts a handle of e released; with none left e becomes idle.
func (t *backings) release(e *backing) {
	s := t.set
	s.mu.Lock()
	defer s.mu.Unlock()
	e.handles--
	if e.handles > 0 || !s.tables[t] {
		return
	}
	e.idle = s.idle.PushBack(e)
	for s.idle.Len() > maxIdleBackings {
		s.drop(s.idle.Front().Value.(*backing))
	}
}

// drop ends idle registration e. Caller holds mu.
func (s *backingSet) drop(e *backing) {
	s.idle.Remove(e.idle)
	e.idle = nil
	delete(e.t.byID, e.id)
	e.t.srv.UnregisterBackingFd(e.bid)
}

// dropIdle ends the idle registrations of content id in every mount (of
// every id when id is zero), so that the cache file can be evicted. It
// reports whether it ended any.
func (s *backingSet) dropIdle(id chunkstore.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	dropped := false
	if id.IsZero() {
		for s.idle.Len() > 0 {
			s.drop(s.idle.Front().Value.(*backing))
			dropped = true
		}
		return dropped
	}
	for t := range s.tables {
		if e := t.byID[id]; e != nil && e.idle != nil {
			s.drop(e)
			dropped = true
		}
	}
	return dropped
}

// forget drops a mount's table once its connection has ended (and with
// it every registration).
func (t *backings) forget() {
	s := t.set
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tables, t)
	for _, e := range t.byID {
		if e.idle != nil {
			s.idle.Remove(e.idle)
			e.idle = nil
		}
	}
	t.byID = map[chunkstore.ID]*backing{}
}

// pass records that the open being answered for request ctx is to be
// served with backing id bid; rawFS.Open puts it in the reply, which
// go-fuse's node API cannot.
func (t *backings) pass(ctx context.Context, bid int32) {
	k := requestKey(ctx)
	if k == nil {
		return // no reply to put it in: nothing would take it
	}
	t.pmu.Lock()
	t.pending[k] = bid
	t.pmu.Unlock()
}

// take returns and forgets the backing id recorded for request cancel.
func (t *backings) take(cancel <-chan struct{}) (int32, bool) {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	bid, ok := t.pending[cancel]
	if ok {
		delete(t.pending, cancel)
	}
	return bid, ok
}

// requestKey identifies the FUSE request a node method serves: go-fuse
// gives it a *fuse.Context whose Cancel channel is the request's own. It
// is nil for any other context.
func requestKey(ctx context.Context) <-chan struct{} {
	if c, ok := ctx.(*fuse.Context); ok {
		return c.Cancel
	}
	return nil
}
