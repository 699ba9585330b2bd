package fuseuring

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring ABI this package uses (include/uapi/linux/io_uring.h).
const (
	setupSQE128       = 1 << 10
	setupSingleIssuer = 1 << 12
	featSingleMmap    = 1 << 0
	enterGetEvents    = 1 << 0
	offSQRing         = 0
	offCQRing         = 0x8000000
	offSQEs           = 0x10000000
	opRead            = 22
	opURingCmd        = 46
	sqeSize           = 128 // SQE128: 64 bytes plus 80 of command data from offset 48
	cqeSize           = 16
)

// params is struct io_uring_params.
type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqOffsets
	cqOff                                                                  cqOffsets
}

type sqOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// sqe is a 128-byte submission entry; cmd is the command area of
// IORING_OP_URING_CMD (80 bytes from offset 48).
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64 // cmd_op in its low 32 bits for URING_CMD
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFd    int32
	cmd         [80]byte
}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// ring is one io_uring with 128-byte submission entries, used by one
// thread only (IORING_SETUP_SINGLE_ISSUER where the kernel has it).
type ring struct {
	fd                 int
	sqMem, cqMem, sqes []byte
	sqHead, sqTail     *uint32
	sqMask             uint32
	sqArray            []uint32
	cqHead, cqTail     *uint32
	cqMask             uint32
	cqes               []cqe
	sqEntries          uint32
	queued             uint32 // entries written since the last enter
}

func newRing(entries uint32) (*ring, error) {
	var p params
	// No IORING_SETUP_DEFER_TASKRUN: its task work runs only when the
	// thread asks for completions, so a request handed to a thread that
	// was killed would wait until the ring is closed, which for a process
	// that uses its own mount never comes. Plain task work is cancelled
	// when the thread exits, and the request ends with an error.
	fd, err := setup(entries, &p, setupSQE128|setupSingleIssuer)
	if err == unix.EINVAL {
		p = params{}
		fd, err = setup(entries, &p, setupSQE128)
	}
	if err != nil {
		return nil, fmt.Errorf("io_uring_setup: %w", err)
	}
	r := &ring{fd: fd, sqEntries: p.sqEntries}
	sqLen := int(p.sqOff.array + p.sqEntries*4)
	cqLen := int(p.cqOff.cqes + p.cqEntries*cqeSize)
	if p.features&featSingleMmap != 0 {
		sqLen = max(sqLen, cqLen)
	}
	if r.sqMem, err = unix.Mmap(fd, offSQRing, sqLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	r.cqMem = r.sqMem
	if p.features&featSingleMmap == 0 {
		if r.cqMem, err = unix.Mmap(fd, offCQRing, cqLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
			r.close()
			return nil, fmt.Errorf("io_uring mmap: %w", err)
		}
	}
	if r.sqes, err = unix.Mmap(fd, offSQEs, int(p.sqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	r.sqHead = (*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.head]))
	r.sqTail = (*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.tail]))
	r.sqMask = *(*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.ringMask]))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.array])), p.sqEntries)
	r.cqHead = (*uint32)(unsafe.Pointer(&r.cqMem[p.cqOff.head]))
	r.cqTail = (*uint32)(unsafe.Pointer(&r.cqMem[p.cqOff.tail]))
	r.cqMask = *(*uint32)(unsafe.Pointer(&r.cqMem[p.cqOff.ringMask]))
	r.cqes = unsafe.Slice((*cqe)(unsafe.Pointer(&r.cqMem[p.cqOff.cqes])), p.cqEntries)
	return r, nil
}

func setup(entries uint32, p *params, flags uint32) (int, error) {
	p.flags = flags
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// next returns a cleared submission entry to fill, submitting what is
// queued first if the submission queue is full.
func (r *ring) next() (*sqe, error) {
	tail := *r.sqTail
	if tail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		if err := r.enter(0); err != nil {
			return nil, err
		}
		if tail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
			return nil, unix.EBUSY
		}
	}
	i := tail & r.sqMask
	s := (*sqe)(unsafe.Pointer(&r.sqes[int(i)*sqeSize]))
	*s = sqe{}
	r.sqArray[i] = i
	atomic.StoreUint32(r.sqTail, tail+1)
	r.queued++
	return s, nil
}

// enter submits the queued entries and waits for at least wait
// completions.
func (r *ring) enter(wait uint32) error {
	flags := uintptr(0)
	if wait > 0 {
		flags = enterGetEvents
	}
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.queued), uintptr(wait), flags, 0, 0)
		switch errno {
		case 0:
			r.queued -= min(r.queued, uint32(n))
			return nil
		case unix.EINTR:
			continue
		default:
			return errno
		}
	}
}

// reap calls f for every completion waiting and consumes them.
func (r *ring) reap(f func(c cqe)) {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		f(r.cqes[head&r.cqMask])
	}
	atomic.StoreUint32(r.cqHead, head)
}

func (r *ring) close() {
	if r.sqes != nil {
		unix.Munmap(r.sqes)
	}
	if r.cqMem != nil && (r.sqMem == nil || &r.cqMem[0] != &r.sqMem[0]) {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	unix.Close(r.fd)
}
