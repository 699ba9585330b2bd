package vmm

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrLimit is wrapped by the error of anything a limit refused: a VM the
// process has no room for, or a guest's fork or snapshot request beyond
// its family's Limits.
var ErrLimit = errors.New("vmm: limit reached")

// RequestRefused is what a guest finds in RAX after a snapshot or fork
// request the VMM refused because of a limit (all bits set: -1).
const RequestRefused = ^uint64(0)

// Limits bound what a guest can make its host spend through requests. They
// apply to a family: a VM made by New (or a VM forked from an image that
// was loaded or opened, not sealed from a VM) and every VM forked from it
// or from its descendants. Zero fields take the defaults below. The host's
// own calls (Image.Fork, VM.Snapshot) are not refused by them, but the VMs
// and bytes they make count.
type Limits struct {
	// MaxVMs bounds the family's live (not closed) VMs; a guest's fork
	// request that would pass it is refused. Default 256.
	MaxVMs int
	// MaxDepth bounds fork generations: a VM at depth MaxDepth (the
	// family's first VM is at 0) cannot have children. Default 16.
	MaxDepth int
	// SnapshotInterval and SnapshotBurst rate-limit the family's guest
	// snapshot requests: up to SnapshotBurst at once, then one per
	// SnapshotInterval; a request beyond is refused. Defaults 100 ms
	// and 8.
	SnapshotInterval time.Duration
	SnapshotBurst    int
	// MaxSnapshotBytes bounds what the family's snapshots may write to
	// stores, counted before deduplication (SnapshotStats.Bytes); once
	// spent, guest snapshot requests are refused. Default 16 GiB.
	MaxSnapshotBytes uint64
}

// Default limits.
const (
	DefaultMaxVMs           = 256
	DefaultMaxDepth         = 16
	DefaultSnapshotInterval = 100 * time.Millisecond
	DefaultSnapshotBurst    = 8
	DefaultMaxSnapshotBytes = 16 << 30
	// DefaultMaxVCPUs is the process-wide bound on live vCPUs (see
	// SetMaxVCPUs). Each holds an OS thread, and the Go runtime ends the
	// process past 10000 threads.
	DefaultMaxVCPUs = 4096
	// DefaultMaxReports is how many reported values a VM keeps (see
	// Config.MaxReports).
	DefaultMaxReports = 4096
)

func (l Limits) withDefaults() Limits {
	if l.MaxVMs <= 0 {
		l.MaxVMs = DefaultMaxVMs
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	if l.SnapshotInterval <= 0 {
		l.SnapshotInterval = DefaultSnapshotInterval
	}
	if l.SnapshotBurst <= 0 {
		l.SnapshotBurst = DefaultSnapshotBurst
	}
	if l.MaxSnapshotBytes == 0 {
		l.MaxSnapshotBytes = DefaultMaxSnapshotBytes
	}
	return l
}

// family is what the VMs of one family share: its limits and tallies.
type family struct {
	limits    Limits
	mu        sync.Mutex
	live      int       // VMs made into the family and not closed
	reserved  int       // children promised to fork requests being handled
	tokens    float64   // snapshot requests allowed now
	lastSnap  time.Time // when tokens was last refilled
	snapBytes uint64
}

func newFamily(l Limits) *family {
	l = l.withDefaults()
	return &family{limits: l, tokens: float64(l.SnapshotBurst)}
}

func (f *family) join() {
	f.mu.Lock()
	f.live++
	f.mu.Unlock()
}

func (f *family) leave() {
	f.mu.Lock()
	f.live--
	f.mu.Unlock()
}

// admitFork reserves n children for a fork request of a VM at depth; the
// caller calls release(n) once the request was handled.
func (f *family) admitFork(depth int, n uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if depth >= f.limits.MaxDepth {
		return fmt.Errorf("fork at depth %d: the family's limit is %d generations: %w", depth, f.limits.MaxDepth, ErrLimit)
	}
	if room := f.limits.MaxVMs - f.live - f.reserved; room < 0 || uint64(n) > uint64(room) {
		return fmt.Errorf("fork of %d children: the family has %d live VMs of at most %d: %w", n, f.live+f.reserved, f.limits.MaxVMs, ErrLimit)
	}
	f.reserved += int(n)
	return nil
}

func (f *family) release(n uint32) {
	f.mu.Lock()
	f.reserved -= int(n)
	f.mu.Unlock()
}

// admitSnapshot refuses a guest snapshot request beyond the family's
// rate (a token bucket), or once its snapshot bytes are spent.
func (f *family) admitSnapshot(now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.snapBytes >= f.limits.MaxSnapshotBytes {
		return fmt.Errorf("snapshot: the family's snapshots wrote %d bytes of at most %d: %w", f.snapBytes, f.limits.MaxSnapshotBytes, ErrLimit)
	}
	if !f.lastSnap.IsZero() {
		f.tokens += float64(now.Sub(f.lastSnap)) / float64(f.limits.SnapshotInterval)
		f.tokens = min(f.tokens, float64(f.limits.SnapshotBurst))
	}
	f.lastSnap = now
	if f.tokens < 1 {
		return fmt.Errorf("snapshot: more than %d at once or one per %v: %w", f.limits.SnapshotBurst, f.limits.SnapshotInterval, ErrLimit)
	}
	f.tokens--
	return nil
}

func (f *family) chargeSnapshot(bytes uint64) {
	f.mu.Lock()
	f.snapBytes += bytes
	f.mu.Unlock()
}

// Process-wide vCPU accounting.
var (
	maxVCPUs  atomic.Int64
	liveVCPUs atomic.Int64
)

func init() { maxVCPUs.Store(DefaultMaxVCPUs) }

// SetMaxVCPUs sets how many vCPUs may be live in this process at once,
// over all VMs including pooled ones (default DefaultMaxVCPUs); making a
// VM beyond it fails with ErrLimit. Each vCPU holds an OS thread.
func SetMaxVCPUs(n int) { maxVCPUs.Store(int64(n)) }

// reserveVCPUs takes n vCPUs from the process's allowance.
func reserveVCPUs(n int) error {
	if liveVCPUs.Add(int64(n)) > maxVCPUs.Load() {
		live := liveVCPUs.Add(-int64(n))
		return fmt.Errorf("vmm: a VM of %d vCPUs: the process has %d live vCPUs of at most %d: %w", n, live, maxVCPUs.Load(), ErrLimit)
	}
	return nil
}

func releaseVCPUs(n int) { liveVCPUs.Add(-int64(n)) }

// reportRing keeps a VM's newest reported values and counts the ones it
// dropped to make room.
type reportRing struct {
	mu      sync.Mutex
	max     int
	buf     []uint32
	start   int // index of the oldest value once buf is full
	dropped uint64
}

func (r *reportRing) add(v uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) < r.max {
		r.buf = append(r.buf, v)
		return
	}
	r.buf[r.start] = v
	r.start = (r.start + 1) % r.max
	r.dropped++
}

func (r *reportRing) values() ([]uint32, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]uint32, 0, len(r.buf))
	out = append(out, r.buf[r.start:]...)
	return append(out, r.buf[:r.start]...), r.dropped
}
