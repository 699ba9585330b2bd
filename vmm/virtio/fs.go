package virtio

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// TypeFS is the virtio-fs device type.
const TypeFS = 26

// virtio-fs and FUSE framing (the FUSE kernel ABI, little-endian).
const (
	// FSTagSize is the size of the tag field of the configuration space.
	FSTagSize = 36
	// MaxFSRequest bounds one request: a 1 MiB write plus its headers.
	MaxFSRequest = 1<<20 + 4096
	// MaxFSReply bounds one reply the device takes from its server.
	MaxFSReply = 1<<20 + 4096
	// maxFSInflight bounds the requests handed to the server and not
	// answered yet; maxFSQueued the bytes waiting to be sent to it.
	maxFSInflight = 256
	maxFSQueued   = 16 << 20

	fuseInHeaderSize  = 40
	fuseOutHeaderSize = 16

	fuseForget      = 2
	fuseInit        = 26
	fuseInterrupt   = 36
	fuseDestroy     = 38
	fuseBatchForget = 42

	fsHiprioQueue = 0
)

// FSRequest is the decoded fuse_in_header of one request chain.
type FSRequest struct {
	Len    uint32
	Opcode uint32
	Unique uint64
	NodeID uint64
}

// DecodeFSRequest copies a chain's readable side into buf (reused) and
// decodes its fuse_in_header. The header's length must cover the header,
// fit in the readable side and be at most MaxFSRequest; the message
// returned is exactly that long (the guest cannot change it afterwards).
func DecodeFSRequest(c *Chain, buf []byte) (FSRequest, []byte, error) {
	if c.ReadLen < fuseInHeaderSize {
		return FSRequest{}, nil, fmt.Errorf("%w: virtio-fs request of %d readable bytes, less than a FUSE header", ErrBadGuest, c.ReadLen)
	}
	msg := c.ReadAll(buf, int(min(c.ReadLen, MaxFSRequest)))
	r := FSRequest{Len: le.Uint32(msg), Opcode: le.Uint32(msg[4:]), Unique: le.Uint64(msg[8:]), NodeID: le.Uint64(msg[16:])}
	if r.Len < fuseInHeaderSize || uint64(r.Len) > uint64(len(msg)) {
		return r, nil, fmt.Errorf("%w: FUSE request (opcode %d) says %d bytes, its chain holds %d (at most %d)", ErrBadGuest, r.Opcode, r.Len, c.ReadLen, MaxFSRequest)
	}
	return r, msg[:r.Len], nil
}

// FS is a virtio-fs device (type 26): one request queue and the
// high-priority queue, carrying FUSE requests from the guest's kernel to
// a FUSE server on the host. Each FUSE_INIT (a mount in the guest) opens
// a new session with Connect; DESTROY, a second INIT, a driver reset and
// Close end it. Requests outside a session are answered EIO by the
// device. A fork carries the session into each clone (fsstate.go): the
// clone's server takes over the parent's tables, so the guest's mount
// goes on (docs/fork-hygiene.md).
//
// The server sees every request the guest's kernel makes, as that kernel
// wrote it: it must treat them as hostile. The device bounds sizes and
// counts, gives the server its own request ids (so that a guest's
// duplicate ids do not confuse it), and drops INTERRUPT (Linux's
// virtio-fs does not send it).
type FS struct {
	// Tag names the file system in the guest (mount -t virtiofs TAG);
	// at most FSTagSize bytes.
	Tag string
	// Connect starts a FUSE server and returns the device's end of a
	// message connection to it (a SOCK_SEQPACKET socket): each request
	// is written as one message, each reply read as one (matched by
	// unique, in any order). The device closes it when the session
	// ends; Close must interrupt a Read in progress (an *os.File of a
	// non-blocking socket does). tables is nil for a new session (a
	// mount in the guest); in a clone it is what FSConn.Export of the
	// parent's server returned, for the new server to take over.
	Connect func(tables []byte) (FSConn, error)

	sess      *fsSession
	throttled [2]bool
	buf       []byte
}

// FSConn is the device's end of a connection to a FUSE server.
type FSConn interface {
	io.ReadWriteCloser
	// Export returns the server's tables (its node ids and open
	// handles), for a server of a copy of the tree to take over in a
	// clone (Connect). The requests sent must have been answered.
	Export() ([]byte, error)
}

type fsSession struct {
	c       FSConn
	init    []byte // the guest's FUSE_INIT, replayed to a clone's server; nil: too long to keep
	out     chan []byte
	queued  atomic.Int64
	pending map[uint64]fsPending // by the server's unique; transport lock
	next    uint64
	closed  sync.Once
}

type fsPending struct {
	q      int
	head   uint16
	unique uint64 // the guest's
	w      []Seg
	drop   bool // a replayed INIT: its answer goes nowhere
}

// Type implements Device.
func (f *FS) Type() uint32 { return TypeFS }

// Features implements Device.
func (f *FS) Features() uint64 { return 0 }

// QueueMax implements Device: hiprio, then one request queue.
func (f *FS) QueueMax() []uint16 { return []uint16{MaxQueueSize, MaxQueueSize} }

// ReadConfig implements Device: the tag (36 bytes, NUL-padded), then
// num_request_queues (1).
func (f *FS) ReadConfig(off uint64, data []byte) {
	var cfg [FSTagSize + 4]byte
	copy(cfg[:FSTagSize], f.Tag)
	le.PutUint32(cfg[FSTagSize:], 1)
	if off < uint64(len(cfg)) {
		copy(data, cfg[off:])
	}
}

// WriteConfig implements Device: the configuration is read-only.
func (f *FS) WriteConfig(off uint64, data []byte) {}

// Reset implements Device: the session ends, requests in flight are
// forgotten.
func (f *FS) Reset() {
	f.endSession()
	f.throttled = [2]bool{}
}

// Close ends the session of the device behind t; call it when the
// machine stops.
func (f *FS) Close(t *Transport) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f.endSession()
}

// Inflight is the number of requests the server has not answered.
// Transport lock (Transport.Do).
func (f *FS) Inflight() int {
	if f.sess == nil {
		return 0
	}
	return len(f.sess.pending)
}

func (f *FS) endSession() {
	s := f.sess
	f.sess = nil
	if s != nil {
		s.close()
	}
}

func (s *fsSession) close() {
	s.closed.Do(func() {
		close(s.out)
		s.c.Close()
	})
}

// Notify implements Device.
func (f *FS) Notify(t *Transport, q int) error {
	if q > 1 {
		return nil
	}
	qu := t.Queue(q)
	for range maxPerNotify {
		if s := f.sess; s != nil && (len(s.pending) >= maxFSInflight || s.queued.Load() >= maxFSQueued) {
			f.throttled[q] = true
			return nil
		}
		c, err := qu.Pop(t.Mem(), MaxFSRequest+MaxFSReply)
		if err != nil || c == nil {
			return err
		}
		n, answered, err := f.handle(t, q, c)
		if err != nil {
			return err
		}
		if answered {
			if err := t.Used(q, c.Head, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// handle takes one chain: it answers it at once (answered true, n bytes
// written) or hands it to the server, which answers later.
func (f *FS) handle(t *Transport, q int, c *Chain) (n uint32, answered bool, err error) {
	req, msg, err := DecodeFSRequest(c, f.buf)
	if err != nil {
		return 0, false, err
	}
	f.buf = msg[:0]
	switch req.Opcode {
	case fuseForget, fuseBatchForget:
		if s := f.sess; s != nil {
			f.send(s, msg)
		}
		return 0, true, nil
	case fuseInterrupt:
		return 0, true, nil
	case fuseDestroy:
		f.endSession()
		return fsAnswer(c, req.Unique, 0), true, nil
	case fuseInit:
		f.endSession()
		if f.Connect == nil {
			return fsAnswer(c, req.Unique, unix.ENODEV), true, nil
		}
		conn, err := f.Connect(nil)
		if err != nil {
			return fsAnswer(c, req.Unique, unix.EIO), true, nil
		}
		f.startSession(t, conn)
		if len(msg) <= maxFSInit {
			f.sess.init = append([]byte(nil), msg...)
		}
	}
	s := f.sess
	if s == nil {
		return fsAnswer(c, req.Unique, unix.EIO), true, nil
	}
	if q == fsHiprioQueue {
		// Only FORGETs belong there; anything else would have no one
		// waiting for its reply in the order the driver expects.
		return fsAnswer(c, req.Unique, unix.EINVAL), true, nil
	}
	s.next++
	le.PutUint64(msg[8:], s.next)
	s.pending[s.next] = fsPending{q: q, head: c.Head, unique: req.Unique, w: c.Writable}
	f.send(s, msg)
	return 0, false, nil
}

// startSession makes conn the device's session and starts its writer and
// reader. Transport lock.
func (f *FS) startSession(t *Transport, conn FSConn) {
	f.sess = &fsSession{c: conn, out: make(chan []byte, 2*maxFSInflight), pending: map[uint64]fsPending{}}
	go f.writer(t, f.sess)
	go f.reader(t, f.sess)
}

// send queues a copy of msg for the server; a full queue (only FORGETs
// can fill it: requests are bounded by maxFSInflight) drops it.
func (f *FS) send(s *fsSession, msg []byte) {
	b := append([]byte(nil), msg...)
	select {
	case s.out <- b:
		s.queued.Add(int64(len(b)))
	default:
	}
}

// fsAnswer writes a reply with only a header (error errno, or success)
// into the chain, when it has room; it returns the bytes written.
func fsAnswer(c *Chain, unique uint64, errno unix.Errno) uint32 {
	if c.WriteLen < fuseOutHeaderSize {
		return 0
	}
	var h [fuseOutHeaderSize]byte
	le.PutUint32(h[:], fuseOutHeaderSize)
	le.PutUint32(h[4:], uint32(-int32(errno)))
	le.PutUint64(h[8:], unique)
	w := c.NewWriter()
	w.Write(h[:])
	return w.Written()
}

// writer sends queued requests to the server, one message each, and
// resumes queues that waited for room.
func (f *FS) writer(t *Transport, s *fsSession) {
	for b := range s.out {
		_, err := s.c.Write(b)
		s.queued.Add(-int64(len(b)))
		if err != nil {
			t.Do(func() error {
				if f.sess == s {
					f.endSession()
				}
				return nil
			})
			continue
		}
		t.Do(func() error { return f.resume(t) })
	}
}

// resume drains the queues that stopped for lack of room. Transport lock.
func (f *FS) resume(t *Transport) error {
	for q := range f.throttled {
		if !f.throttled[q] {
			continue
		}
		f.throttled[q] = false
		if err := f.Notify(t, q); err != nil {
			return err
		}
	}
	return nil
}

// fsReply writes the server's reply msg (at least a header) into the
// chain of p under the guest's unique and returns the bytes written. A
// reply whose header's length is not the message's, longer than
// MaxFSReply or than the chain's room, is answered -EIO instead.
func fsReply(p fsPending, msg []byte) uint32 {
	c := &Chain{Head: p.head, Writable: p.w}
	for _, w := range p.w {
		c.WriteLen += uint64(len(w))
	}
	n := len(msg)
	if n < fuseOutHeaderSize || n > MaxFSReply || uint64(n) > c.WriteLen || uint64(le.Uint32(msg)) != uint64(n) {
		return fsAnswer(c, p.unique, unix.EIO)
	}
	le.PutUint64(msg[8:], p.unique)
	w := c.NewWriter()
	w.Write(msg)
	return w.Written()
}

// reader takes the server's replies and completes their chains.
func (f *FS) reader(t *Transport, s *fsSession) {
	buf := make([]byte, MaxFSReply+1)
	for {
		n, err := s.c.Read(buf)
		if err != nil || n == 0 {
			t.Do(func() error {
				if f.sess == s {
					f.endSession()
				}
				return nil
			})
			return
		}
		if n < fuseOutHeaderSize {
			continue
		}
		msg := buf[:n]
		unique := le.Uint64(msg[8:])
		if unique == 0 {
			continue // a notification: the device does not pass them on
		}
		t.Do(func() error {
			if f.sess != s {
				return nil
			}
			p, ok := s.pending[unique]
			if !ok {
				return nil
			}
			delete(s.pending, unique)
			if p.drop {
				return nil
			}
			if err := t.Used(p.q, p.head, fsReply(p, msg)); err != nil {
				return err
			}
			return f.resume(t)
		})
	}
}

// WaitIdle waits up to timeout for the server to answer every request
// in flight (call it with the vCPUs paused, before a fork takes guest
// memory, so that no clone waits for an answer its device never gets).
// It returns the number still unanswered.
func (f *FS) WaitIdle(t *Transport, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		t.mu.Lock()
		n := f.Inflight()
		t.mu.Unlock()
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(time.Millisecond)
	}
}
