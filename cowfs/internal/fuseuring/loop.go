package fuseuring

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// loop is one thread bound to one CPU with one ring, serving the ring
// entries of one connection's queue for that CPU: the kernel puts a
// request on the queue of the CPU its caller runs on and hands it to the
// thread that registered the entry, so the request is answered on the
// CPU that made it. Each connection has loops of its own, so that a
// request that waits long (on a lock held by a commit, say) holds up only
// its own mount's requests from that CPU, never another mount's.
type loop struct {
	cpu int // -1 for the loop that holds the queues of CPUs not online
	r   *ring

	efd    int
	efdBuf [8]byte

	mu   sync.Mutex
	work []func() // run on the loop's thread

	ents  map[uint64]*entry // by user data
	next  uint64
	added bool // entries were registered; the loop ends when none is left
}

// efdTag is the user data of the eventfd read that wakes a loop.
const efdTag = ^uint64(0)

// maxThreads bounds the loop threads of the process (one per CPU per
// mount); a mount past it is served over /dev/fuse.
const maxThreads = 4096

var threads atomic.Int64

// queues lists, for each queue id (CPU number), the CPU its loop is bound
// to, or -1 for a CPU that is possible but not online.
func queues() ([]int, error) {
	possible, err := cpuList("/sys/devices/system/cpu/possible")
	if err != nil {
		return nil, err
	}
	online, err := cpuList("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, err
	}
	n := 0
	for _, c := range possible {
		n = max(n, c+1)
	}
	q := make([]int, n)
	for i := range q {
		q[i] = -1
	}
	for _, c := range online {
		if c < n {
			q[c] = c
		}
	}
	return q, nil
}

// cpuList parses a kernel CPU list such as "0-3,8".
func cpuList(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cpus []int
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, b, err)
		}
		z := a
		if isRange {
			if z, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("%s: %q: %w", path, b, err)
			}
		}
		if z < a || z-a > 1<<16 {
			return nil, fmt.Errorf("%s: bad range %q", path, part)
		}
		for c := a; c <= z; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// newLoop starts a loop's thread and waits until its ring is made.
func newLoop(cpu int) (*loop, error) {
	if threads.Add(1) > maxThreads {
		threads.Add(-1)
		return nil, fmt.Errorf("more than %d FUSE ring threads", maxThreads)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		threads.Add(-1)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	l := &loop{cpu: cpu, efd: efd, ents: map[uint64]*entry{}}
	started := make(chan error, 1)
	go l.run(started)
	if err := <-started; err != nil {
		return nil, err
	}
	return l, nil
}

// run is the loop's thread. It returns once the kernel gave back every
// entry registered on it (the connection ended), or when stop is posted
// before any was.
func (l *loop) run(started chan<- error) {
	runtime.LockOSThread()
	// The thread goes back to the runtime with its old CPU mask, not
	// ended: a child that a goroutine started from this thread earlier
	// with a parent-death signal (sandbox init steps are) would get it
	// when the thread ended.
	defer runtime.UnlockOSThread()
	defer threads.Add(-1)
	defer unix.Close(l.efd)
	if l.cpu >= 0 {
		var was, set unix.CPUSet
		set.Set(l.cpu)
		// A CPU outside this process's cpuset is served unbound.
		if unix.SchedGetaffinity(0, &was) == nil && unix.SchedSetaffinity(0, &set) == nil {
			defer unix.SchedSetaffinity(0, &was)
		}
	}
	r, err := newRing(256)
	if err != nil {
		started <- err
		return
	}
	defer r.close()
	l.r = r
	if err = l.armWake(); err == nil {
		err = r.enter(0)
	}
	if err != nil {
		started <- fmt.Errorf("io_uring: %w", err)
		return
	}
	started <- nil
	for !l.added || len(l.ents) > 0 {
		// EBUSY: completions wait in the kernel's overflow list until
		// these are reaped. Any other error is a broken ring, on which the
		// mount could not be served.
		if err := r.enter(1); err != nil && err != unix.EBUSY {
			panic(fmt.Sprintf("fuseuring: io_uring_enter on cpu %d: %v", l.cpu, err))
		}
		r.reap(l.complete)
	}
}

// stop ends a loop that has no entries.
func (l *loop) stop() {
	l.post(func() { l.added = true })
}

// armWake queues a read of the eventfd that post writes.
func (l *loop) armWake() error {
	s, err := l.r.next()
	if err != nil {
		return err
	}
	s.opcode = opRead
	s.fd = int32(l.efd)
	s.addr = uint64(uintptr(unsafe.Pointer(&l.efdBuf[0])))
	s.len = 8
	s.userData = efdTag
	return nil
}

// post runs f on the loop's thread.
func (l *loop) post(f func()) {
	l.mu.Lock()
	l.work = append(l.work, f)
	l.mu.Unlock()
	one := [8]byte{1}
	unix.Write(l.efd, one[:])
}

// complete handles one completion on the loop's thread.
func (l *loop) complete(c cqe) {
	if c.userData == efdTag {
		l.mu.Lock()
		work := l.work
		l.work = nil
		l.mu.Unlock()
		for _, f := range work {
			f()
		}
		if err := l.armWake(); err != nil {
			panic(fmt.Sprintf("fuseuring: rearm wake-up on cpu %d: %v", l.cpu, err))
		}
		return
	}
	e := l.ents[c.userData]
	if e == nil {
		return
	}
	if c.res < 0 {
		// The connection ended (ENOTCONN, ECANCELED), or the kernel
		// refused the entry.
		delete(l.ents, c.userData)
		e.c.entryDone(e, unix.Errno(-c.res))
		return
	}
	e.serve()
}

// add registers e with the kernel from the loop's thread.
func (l *loop) add(e *entry) {
	l.added = true
	l.next++
	e.id = l.next
	l.ents[e.id] = e
	if err := e.submit(cmdRegister, 0); err != nil {
		delete(l.ents, e.id)
		e.c.entryDone(e, err)
	}
}
