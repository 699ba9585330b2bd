package fuseuring

import (
	"encoding/binary"
	"fmt"
	"sync"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The FUSE-over-io_uring ABI (include/uapi/linux/fuse.h, protocol 7.42).
const (
	cmdRegister       = 1 // FUSE_IO_URING_CMD_REGISTER
	cmdCommitAndFetch = 2 // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

	inHeaderSize  = 40  // struct fuse_in_header
	outHeaderSize = 16  // struct fuse_out_header
	opInOff       = 128 // fuse_uring_req_header.op_in
	opInSize      = 128
	entInOutOff   = 256 // fuse_uring_req_header.ring_ent_in_out
	headerSize    = 288 // sizeof(struct fuse_uring_req_header)
	iovOff        = 512 // where an entry keeps its two iovecs
	pageSize      = 4096

	// depth is the number of entries of a connection per CPU queue. A
	// loop answers its entries one at a time, except the operations that
	// may take long (runAsync), so a queue goes on while up to depth-1 of
	// those run.
	depth = 4

	// keepPayload is how much of an entry's payload buffer stays
	// resident; what larger requests used is given back lazily
	// (MADV_FREE) at the first smaller request after them.
	keepPayload = 64 << 10
)

// Conn is one FUSE connection served over io_uring. Requests that the
// kernel still sends on /dev/fuse (FORGET, INTERRUPT, and the requests
// made before the rings were ready) stay with go-fuse's own server.
type Conn struct {
	fd      int // our own descriptor of the connection
	ps      *fuse.ProtocolServer
	payload int

	mu    sync.Mutex
	live  int
	err   error // the first refusal of an entry
	ended chan struct{}
}

// entry is one ring entry: a header area and a payload buffer that the
// kernel fills with a request and reads the answer from.
type entry struct {
	c       *Conn
	l       *loop
	qid     uint16
	id      uint64
	mem     []byte // header page, then the payload
	hdr     []byte
	payload []byte
	scratch []byte // a copy of a small request payload
	tail    int    // payload bytes used past keepPayload since last given back
}

func (c *Conn) newEntry(l *loop, qid int) (*entry, error) {
	mem, err := unix.Mmap(-1, 0, pageSize+c.payload, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("ring entry buffers: %w", err)
	}
	e := &entry{c: c, l: l, qid: uint16(qid), mem: mem, hdr: mem[:headerSize], payload: mem[pageSize:]}
	iov := (*[2]unix.Iovec)(unsafe.Pointer(&mem[iovOff]))
	iov[0].Base, iov[0].Len = &e.hdr[0], headerSize
	iov[1].Base, iov[1].Len = &e.payload[0], uint64(c.payload)
	return e, nil
}

// submit queues the entry's command: a registration, or the answer
// with commit id commit and the fetch of the next request.
func (e *entry) submit(cmd uint32, commit uint64) error {
	s, err := e.l.r.next()
	if err != nil {
		return err
	}
	s.opcode = opURingCmd
	s.fd = int32(e.c.fd)
	s.off = uint64(cmd)
	if cmd == cmdRegister {
		s.addr = uint64(uintptr(unsafe.Pointer(&e.mem[iovOff])))
		s.len = 2
	}
	s.userData = e.id
	// struct fuse_uring_cmd_req: flags, commit_id, qid.
	binary.LittleEndian.PutUint64(s.cmd[8:], commit)
	binary.LittleEndian.PutUint16(s.cmd[16:], e.qid)
	return nil
}

// serve answers the request the kernel put in the entry, on the loop's
// thread or, for an operation that may take long, on a goroutine of its
// own whose answer the loop commits.
func (e *entry) serve() {
	h := e.hdr
	opcode := binary.LittleEndian.Uint32(h[4:])
	if runAsync(opcode) {
		go func() {
			commit := e.handle()
			e.l.post(func() { e.commit(commit) })
		}()
		return
	}
	e.commit(e.handle())
}

// handle runs the request through go-fuse and writes the answer into
// the entry. It returns the commit id.
func (e *entry) handle() uint64 {
	h := e.hdr
	length := binary.LittleEndian.Uint32(h[0:])
	commit := binary.LittleEndian.Uint64(h[entInOutOff+8:])
	payloadSize := binary.LittleEndian.Uint32(h[entInOutOff+16:])
	unique := binary.LittleEndian.Uint64(h[8:])
	n, status := 0, fuse.EIO
	if in, ok := e.input(length, payloadSize); ok {
		out := [][]byte{h[:outHeaderSize], e.payload}
		n, status = e.c.ps.HandleRequest(in, out)
	}
	if !status.Ok() || n < outHeaderSize {
		// No answer was written: answer the error (an answer the
		// kernel expects none for cannot come on a ring).
		if status.Ok() {
			status = fuse.EIO
		}
		binary.LittleEndian.PutUint32(h[0:], outHeaderSize)
		binary.LittleEndian.PutUint32(h[4:], uint32(-int32(status)))
		binary.LittleEndian.PutUint64(h[8:], unique)
		n = outHeaderSize
	}
	binary.LittleEndian.PutUint32(h[entInOutOff+16:], uint32(n-outHeaderSize))
	if used := max(int(payloadSize), n-outHeaderSize); used > keepPayload {
		// Kept while large requests come: giving pages back after each
		// one made every page fault again at the next, and a stream of
		// 1 MiB WRITEs 5x slower on this kind of guest (ADR 0191).
		e.tail = max(e.tail, used)
	} else if e.tail > 0 {
		end := min((e.tail+pageSize-1)&^(pageSize-1), len(e.payload))
		unix.Madvise(e.payload[keepPayload:end], unix.MADV_FREE)
		e.tail = 0
	}
	return commit
}

// input gives the request as go-fuse reads it from /dev/fuse: the in
// header, the operation's own header and the payload. The payload is
// copied unless the operation is WRITE, so that an answer written into
// the payload buffer never overwrites input still to be read.
func (e *entry) input(length, payloadSize uint32) ([][]byte, bool) {
	if payloadSize > uint32(len(e.payload)) || length < inHeaderSize+payloadSize {
		return nil, false
	}
	opSize := length - inHeaderSize - payloadSize
	if opSize > opInSize {
		return nil, false
	}
	payload := e.payload[:payloadSize]
	if binary.LittleEndian.Uint32(e.hdr[4:]) != opWrite {
		if cap(e.scratch) < len(payload) {
			e.scratch = make([]byte, len(payload))
		}
		e.scratch = e.scratch[:len(payload)]
		copy(e.scratch, payload)
		payload = e.scratch
	}
	return [][]byte{e.hdr[:inHeaderSize], e.hdr[opInOff : opInOff+opSize], payload}, true
}

// commit sends the answer and asks for the next request.
func (e *entry) commit(id uint64) {
	if err := e.submit(cmdCommitAndFetch, id); err != nil {
		delete(e.l.ents, e.id)
		e.c.entryDone(e, err)
	}
}

// Opcodes this package looks at.
const (
	opWrite          = 16
	opFsync          = 20
	opFsyncdir       = 30
	opSetlkw         = 33
	opPoll           = 40
	opFallocate      = 43
	opCopyFileRange  = 47
	opCopyFileRange2 = 53
)

// runAsync reports whether an operation may take long (a commit of the
// branch, a lock wait, a copy), so that it must not hold up the other
// requests of its CPU's queue. LSEEK is not one: it costs what a READ
// costs, and `grep -r` sends one for every file bigger than its buffer,
// each of which waited 100–150 µs for a goroutine to be woken and to
// answer. Nor is IOCTL: cowfs implements none, so each is answered
// ENOTTY at once, and Python asks one (isatty) at every open of a file,
// which took 96 µs where a CREATE took 15.
func runAsync(opcode uint32) bool {
	switch opcode {
	case opFsync, opFsyncdir, opSetlkw, opPoll, opFallocate, opCopyFileRange, opCopyFileRange2:
		return true
	}
	return false
}

// entryDone retires an entry the kernel gave back.
func (c *Conn) entryDone(e *entry, err error) {
	unix.Munmap(e.mem)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != unix.ENOTCONN && err != unix.ECANCELED && c.err == nil {
		c.err = err
	}
	c.live--
	if c.live == 0 {
		unix.Close(c.fd)
		close(c.ended)
	}
}

// Live reports whether the kernel took every ring entry of the
// connection and has not given them back: its requests come over the
// rings.
func (c *Conn) Live() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil && c.live > 0
}
