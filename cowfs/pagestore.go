package cowfs

import "sync/atomic"

// A file's content put in the kernel's page cache (ADR 0211).
//
// The kernel's write-through path marks a page of a file up to date only
// when one write covers all of it: the last page of nearly every file, and
// every page a write boundary crosses, stay out of date, so the first read
// after writing a file is a READ request. An unchanged file's first read
// is one too. A READ the server answers also makes the kernel forget the
// file's atime, so the next stat of the file is a GETATTR.
//
// So the server puts the whole content of a file in the kernel's page
// cache (FUSE_NOTIFY_STORE) when its last writer closes it, as a native
// file system leaves written data there, and at the first open for
// reading of a small file whose content it has not put. Mounts ask for
// explicit data cache control: otherwise the kernel drops a file's pages
// whenever it sees a new mtime, which after a write is at the next stat or
// read.
//
// The kernel completes a put only once it can lock each page of the range,
// and a reader or a writer holds its pages locked until its READ or WRITE
// is answered; with FUSE over io_uring that answer may be queued behind
// the put on the same loop. So a put starts only when the kernel has no
// open file of the inode (the server's count of open handles is never
// below the kernel's: an open is counted before it is answered, and a
// handle is released only after its last request), and every open and
// truncation of the file waits until the put ends (waitPut). Nothing can
// then hold a page of the file while waiting for the server, and the put
// never carries older bytes than the file has.

// Bounds of the files whose content is put. At the first open for
// reading: the files read through the page cache rather than passthrough
// (passthroughMin). At the release of a writer: bigger ones too, whose
// pages the kernel holds already, out of date where writes split them;
// they are read through the page cache until a commit.
const (
	openPutMax    = passthroughMin
	releasePutMax = 1 << 20
)

// putStart returns the content of n's file to put in the kernel's page
// cache, or nil when it is not to be put (or is bigger than max). The file
// is marked as being put until put ends. Caller holds b.mu.
func (b *branch) putStart(n *node, max int64) []byte {
	in := n.in
	if n.paged || !b.keepCache || in.typ != TypeFile || in.opens > 0 || in.putting != nil ||
		in.size == 0 || in.size >= max || in.nlink == 0 {
		return nil
	}
	data := make([]byte, in.size)
	if m, err := b.readAt(in, data, 0); err != nil || m != len(data) {
		return nil
	}
	in.putting = make(chan struct{})
	return data
}

// put puts data, which putStart returned for n, in the kernel's page
// cache, then ends the put. Caller holds b.mu, which is released during
// the put.
func (b *branch) put(n *node, data []byte) {
	in := n.in
	b.mu.Unlock()
	hook := putTestHook.Load()
	if hook != nil {
		(*hook)(false)
	}
	// An error (ENOENT: the kernel forgot the inode) leaves the cache as
	// it was, which is correct, only slower.
	errno := n.WriteCache(0, data)
	b.mu.Lock()
	close(in.putting)
	in.putting = nil
	n.paged = errno == 0
	if hook != nil {
		(*hook)(true)
	}
}

// putTestHook, when set (by tests), runs before a put (false) and after
// it (true).
var putTestHook atomic.Pointer[func(done bool)]

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
