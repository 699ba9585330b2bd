package cowfs

import (
	"context"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

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
