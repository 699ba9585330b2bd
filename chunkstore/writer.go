package chunkstore

import (
	"fmt"
	"os"
	"sync"
)

// Pack bytes are written by a background goroutine, so that hashing and
// compression go on while the kernel copies the previous buffer. The open
// pack's buffer is handed off as a "flight" once it holds writeBufSize
// bytes; reads find records in flights until they are written.

const maxFlights = 4 // buffers queued for writing before appends wait

type flight struct {
	pack uint32
	f    *os.File
	off  int64
	data []byte
}

// flights is the queue of buffers to write, shared by the store (which
// holds s.mu when it uses it) and the writer goroutine (which never takes
// s.mu).
type flights struct {
	mu    sync.Mutex
	cond  *sync.Cond
	queue []*flight
	err   error // first write error; sticky
	kick  chan struct{}
	done  chan struct{}
	bufs  sync.Pool
}

func newFlights() *flights {
	fl := &flights{kick: make(chan struct{}, 1), done: make(chan struct{})}
	fl.cond = sync.NewCond(&fl.mu)
	fl.bufs.New = func() any { b := make([]byte, 0, writeBufSize+(1<<20)); return &b }
	go fl.run()
	return fl
}

func (fl *flights) run() {
	defer close(fl.done)
	for range fl.kick {
		for {
			fl.mu.Lock()
			if len(fl.queue) == 0 {
				fl.mu.Unlock()
				break
			}
			f := fl.queue[0]
			fl.mu.Unlock()
			_, err := f.f.WriteAt(f.data, f.off)
			fl.mu.Lock()
			fl.queue = fl.queue[1:]
			if err != nil && fl.err == nil {
				fl.err = fmt.Errorf("chunkstore: write pack %s offset %d: %w", f.f.Name(), f.off, err)
			}
			b := f.data[:0]
			fl.bufs.Put(&b)
			fl.cond.Broadcast()
			fl.mu.Unlock()
		}
	}
}

// push queues a buffer for writing.
func (fl *flights) push(f *flight) {
	fl.mu.Lock()
	fl.queue = append(fl.queue, f)
	fl.mu.Unlock()
	select {
	case fl.kick <- struct{}{}:
	default:
	}
}

// throttle waits until fewer than maxFlights buffers are queued.
func (fl *flights) throttle() error {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for len(fl.queue) >= maxFlights && fl.err == nil {
		fl.cond.Wait()
	}
	return fl.err
}

// drain waits until every queued buffer is written.
func (fl *flights) drain() error {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for len(fl.queue) > 0 {
		fl.cond.Wait()
	}
	return fl.err
}

// read copies the bytes at off of pack n into p if a queued buffer holds them.
func (fl *flights) read(n uint32, off int64, p []byte) bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for _, f := range fl.queue {
		if f.pack == n && off >= f.off && off+int64(len(p)) <= f.off+int64(len(f.data)) {
			copy(p, f.data[off-f.off:])
			return true
		}
	}
	return false
}

func (fl *flights) newBuf() []byte { return (*fl.bufs.Get().(*[]byte))[:0] }

// stop ends the writer goroutine after the queue is drained.
func (fl *flights) stop() {
	fl.drain()
	close(fl.kick)
	<-fl.done
}

// handOff queues the open pack's buffer for writing. Caller holds s.mu.
func (s *Store) handOffLocked() {
	w := s.w
	if len(w.buf) == 0 {
		return
	}
	s.fl.push(&flight{pack: w.num, f: w.f, off: w.base, data: w.buf})
	w.base += int64(len(w.buf))
	w.buf = s.fl.newBuf()
}
