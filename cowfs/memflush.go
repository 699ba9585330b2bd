package cowfs

import (
	"context"
	"sync/atomic"
	"time"
)

// A branch whose in-memory files (memfile.go) fill its budget stores
// them in the chunk store in the background, while the mount serves:
// otherwise every small file written after that would get an overlay
// file of its own, a host create, write and later unlink each, which on
// a disk with slow metadata costs far more than storing the bytes in the
// store's packs, where appends are cheap (ADR 0201). Writes that come
// while the flush runs go to overlay files, as before. The commit that
// follows makes the stored files part of the branch's head, so that
// nothing the store holds is reachable only from memory. The flush
// waits for the budget to fill, not less: its hashing and compression
// would otherwise compete for the CPUs with the writer of files that
// fit in memory, work that the next commit does anyway.

// memFlushMin is the least a branch must hold in memory before it is
// flushed: less is not worth a commit.
const memFlushMin = 1 << 20

// memFlushBackoff is how long a branch waits before it flushes again
// after a flush that stored nothing or whose commit failed (a full disk,
// say, or files all written again while they were cut): without it every
// write would start the same futile flush of the whole budget.
const memFlushBackoff = time.Second

// flushMemBehind starts a background flush of the branch's in-memory
// files, when they hold at least half its budget (so that the FS's
// budget, shared by every branch, is not what is short) and none is
// under way. Called when a write finds the budget full. Caller holds
// b.mu.
func (b *branch) flushMemBehind() {
	bmax, _ := b.fs.memBudget()
	if b.memFlush || b.memUsed < bmax/2 || b.memUsed < memFlushMin || !b.bound() || time.Now().Before(b.memFlushAfter) {
		return
	}
	var fs []*frozenFile
	for fd, in := range b.memFiles {
		if in.f == fd && fd.changed && fd.ovPath == "" {
			fs = append(fs, freeze(in))
		}
	}
	if len(fs) == 0 {
		return
	}
	b.memFlush = true
	go b.flushMem(b.name, fs)
}

// flushMem cuts the frozen files without the lock, then, with it,
// installs those that did not change meanwhile (which frees their
// memory) and commits.
func (b *branch) flushMem(name string, fs []*frozenFile) {
	ctx := context.Background()
	for _, f := range fs {
		f.cut(ctx, b.fs.store, name)
	}
	if hook := flushMemTestHook.Swap(nil); hook != nil {
		(*hook)()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.memFlush = false
	if !b.bound() || b.name != name {
		return // an unmount or a rebind came first
	}
	installed := false
	for _, f := range fs {
		fd := f.in.f
		if f.err == nil && fd == f.fd && fd.gen == f.gen && fd.ovPath == "" && fd.changed {
			if err := b.installFile(f.in, f.out); err != nil {
				break
			}
			installed = true
		}
	}
	// A failed commit leaves the files for the next commit to store
	// again.
	if !installed {
		b.memFlushAfter = time.Now().Add(memFlushBackoff)
	} else if _, err := b.commitRefs(ctx, false); err != nil {
		b.memFlushAfter = time.Now().Add(memFlushBackoff)
	}
}

// flushMemTestHook, when set (by tests), runs once after flushMem cut
// the files and before it takes the lock again.
var flushMemTestHook atomic.Pointer[func()]
