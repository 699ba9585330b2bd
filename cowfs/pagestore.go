package cowfs

import (
	"encoding/binary"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Written files' pages put in the kernel's page cache (ADR 0211).
//
// The kernel's write-through path marks a page of a file up to date only
// when one write covers all of it: the last page of nearly every file, and
// every page a write boundary crosses, stay out of date, so the first read
// after writing a file is a READ request. A READ the server answers also
// makes the kernel forget the file's atime, so the next stat is a GETATTR.
// When the last writer of a small file closes it, the server puts the
// whole content in the kernel's page cache (FUSE_NOTIFY_STORE), as a
// native file system leaves written data there. Mounts ask for explicit
// data cache control: otherwise the kernel drops a file's pages whenever
// it sees a new mtime, which after a write is at the next stat or read.
//
// A put must never hold older bytes than the file has: a writer that
// changed the file while the put was on its way would find its bytes
// overwritten in the cache. So a put starts only when the file has no
// writer, and an open for writing or a truncation waits until the puts
// of its file end (waitPut). The kernel completes a put only once it can
// lock each page, which a reader holds until its READ is answered, so
// neither the put nor such a wait may hold up the requests of an
// io_uring loop: the put runs on a goroutine of its own, and the loops
// serve an open that may wait on a goroutine too (putGate).

// pageStoreMax bounds the files whose content is put: the smaller ones,
// read through the page cache rather than passthrough (passthroughMin).
const pageStoreMax = passthroughMin

// pageStore returns the content of h's file to put in the kernel's page
// cache as h, its last writer, is released, or nil. It marks the file as
// being put until putPages ends. Caller holds b.mu.
func (b *branch) pageStore(h *handle) []byte {
	in := h.in
	if !b.keepCache || !in.unstored || in.typ != TypeFile || b.writing[in] > 0 || in.nlink == 0 ||
		in.size == 0 || in.size >= pageStoreMax || in.backedOpens > 0 || in.putting != nil || h.n.in != in {
		return nil
	}
	if !b.gate.start() {
		return nil
	}
	data := make([]byte, in.size)
	if n, err := b.readAt(in, data, 0); err != nil || n != len(data) {
		b.gate.end()
		return nil
	}
	in.unstored = false
	in.putting = make(chan struct{})
	return data
}

// putPages puts data, the content pageStore returned for h, in the
// kernel's page cache. It runs on a goroutine of its own (see above).
func (b *branch) putPages(h *handle, data []byte) {
	if hook := putTestHook.Load(); hook != nil {
		(*hook)()
	}
	// An error (the kernel forgot the inode: ENOENT) leaves the cache as
	// it was, which is correct, only slower.
	h.n.WriteCache(0, data)
	b.mu.Lock()
	close(h.in.putting)
	h.in.putting = nil
	b.mu.Unlock()
	b.gate.end()
}

// putTestHook, when set (by tests), runs before a put.
var putTestHook atomic.Pointer[func()]

// waitPut waits until no content of in is being put in the kernel's page
// cache, and reports whether it waited. Caller holds b.mu, which is
// released while waiting; the caller looks its inode up again after.
func (b *branch) waitPut(in *inode) bool {
	waited := false
	for in.putting != nil {
		ch := in.putting
		b.mu.Unlock()
		<-ch
		b.mu.Lock()
		waited = true
	}
	return waited
}

// putGate keeps the requests that may wait for a put (waitPut) off the
// io_uring loops while puts are on their way, and keeps puts from
// starting while such a request is served on a loop. Each side counts
// itself first and then looks at the other's count, so that at least one
// of two that meet sees the other.
type putGate struct {
	puts   atomic.Int64 // puts on their way
	onLoop atomic.Int64 // requests that may wait, served on a loop
}

// Opcodes and fields of the requests that may wait for a put.
const (
	opSetattr = 4
	opOpen    = 14
)

// mayWait reports whether the request is one that waits for the puts of
// its file: an open for writing or truncating, a truncation. op is its
// operation header (fuse_open_in, fuse_setattr_in).
func mayWait(opcode uint32, op []byte) bool {
	if len(op) < 4 {
		return false
	}
	v := binary.LittleEndian.Uint32(op)
	switch opcode {
	case opOpen:
		return v&syscall.O_ACCMODE != syscall.O_RDONLY || v&syscall.O_TRUNC != 0
	case opSetattr:
		return v&fuse.FATTR_SIZE != 0
	}
	return false
}

// admit reports whether a request may be served on a loop.
func (g *putGate) admit(opcode uint32, op []byte) bool {
	if !mayWait(opcode, op) {
		return true
	}
	g.onLoop.Add(1)
	if g.puts.Load() == 0 {
		return true
	}
	g.onLoop.Add(-1)
	return false
}

// done ends a request admitted on a loop.
func (g *putGate) done(opcode uint32, op []byte) {
	if mayWait(opcode, op) {
		g.onLoop.Add(-1)
	}
}

// start reports whether a put may start, and if so counts it until end.
func (g *putGate) start() bool {
	g.puts.Add(1)
	if g.onLoop.Load() == 0 {
		return true
	}
	g.puts.Add(-1)
	return false
}

// end ends a put.
func (g *putGate) end() { g.puts.Add(-1) }
