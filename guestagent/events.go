package guestagent

import (
	"os"
	"sync"
	"time"

	"tine/guestagent/procfs"
	"tine/guestagent/proto"
)

// minScanGap is the least time between two scans, however many triggers
// arrive.
const minScanGap = 100 * time.Millisecond

// subscriberQueue is how many events wait for a slow subscriber before
// further events are counted as lost.
const subscriberQueue = 1024

// tracker turns what the agent sees into events. Processes the agent
// started and children it reaped are reported exactly, as they happen.
// Everything else is found by diffing /proc and /proc/net scans, which run
// on triggers (an exec starts or ends, a child is reaped, a process writes
// output) and at a slow fallback interval, and only while someone
// subscribes.
type tracker struct {
	fs       *procfs.FS
	interval time.Duration
	kickc    chan struct{}
	done     chan struct{}

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	procs map[int]proto.Process
	ports map[portKey]proto.Port
	self  int
	// forking counts the agent's forks under way (starting).
	forking int
}

// portKey names a socket; its owner may change without it changing.
type portKey struct {
	proto, addr string
	port        uint16
	inode       uint64
}

func keyOf(p proto.Port) portKey { return portKey{p.Proto, p.Address, p.Port, p.Inode} }

// subscriber is one events stream.
type subscriber struct {
	ch   chan proto.Event
	mu   sync.Mutex
	lost int
}

func (s *subscriber) takeLost() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.lost
	s.lost = 0
	return n
}

func newTracker(fs *procfs.FS, interval time.Duration) *tracker {
	t := &tracker{fs: fs, interval: interval, kickc: make(chan struct{}, 1), done: make(chan struct{}),
		subs: map[*subscriber]struct{}{}, self: os.Getpid()}
	go t.loop()
	return t
}

func (t *tracker) stop() { close(t.done) }

// subscribe adds a subscriber; the first one primes the known state
// without events, so it sees changes from now on.
func (t *tracker) subscribe() *subscriber {
	s := &subscriber{ch: make(chan proto.Event, subscriberQueue)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.subs) == 0 {
		t.procs, t.ports = map[int]proto.Process{}, map[portKey]proto.Port{}
		t.scanLocked(false)
	}
	t.subs[s] = struct{}{}
	t.kick()
	return s
}

func (t *tracker) unsubscribe(s *subscriber) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.subs, s)
}

// kick asks for a scan soon; it never blocks.
func (t *tracker) kick() {
	select {
	case t.kickc <- struct{}{}:
	default:
	}
}

// starting tells the tracker that the agent is about to fork a child;
// it must be followed by started, or by startFailed when the fork failed.
// Meanwhile scans leave new children of the agent unreported: one seen
// between its fork and its exec would be reported with the agent's argv,
// or none, in place of its own.
func (t *tracker) starting() {
	t.mu.Lock()
	t.forking++
	t.mu.Unlock()
}

// startFailed ends a starting whose fork failed.
func (t *tracker) startFailed() {
	t.mu.Lock()
	t.forking--
	t.mu.Unlock()
}

// started reports process pid, which the agent started, unless a scan
// already saw it, and ends its starting. read reads the process; it is
// called only while someone subscribes.
func (t *tracker) started(pid int, read func() proto.Process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forking--
	if _, known := t.procs[pid]; !known && len(t.subs) > 0 {
		p := read()
		t.procs[pid] = p
		t.publish(proto.Event{Type: proto.EventProcessStarted, Process: &p})
	}
	t.kick()
}

// exited reports a child the agent reaped, whether it started it or it
// was an orphan given to the agent.
func (t *tracker) exited(pid int, exit proto.Exit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.subs) > 0 {
		p, ok := t.procs[pid]
		if !ok {
			p = proto.Process{PID: pid}
		}
		delete(t.procs, pid)
		t.publish(proto.Event{Type: proto.EventProcessExited, Process: &p, Exit: &exit})
	}
	t.kick()
}

func (t *tracker) loop() {
	timer := time.NewTimer(t.interval)
	defer timer.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-t.kickc:
		case <-timer.C:
		}
		t.mu.Lock()
		if len(t.subs) > 0 {
			t.scanLocked(true)
		}
		t.mu.Unlock()
		timer.Reset(t.interval)
		select {
		case <-t.done:
			return
		case <-time.After(minScanGap):
		}
	}
}

// scanLocked diffs /proc and the port tables against what is known and,
// when emit is set, publishes the differences.
func (t *tracker) scanLocked(emit bool) {
	procs, err := t.fs.List()
	if err == nil {
		seen := make(map[int]bool, len(procs))
		for _, p := range procs {
			seen[p.PID] = true
			old, ok := t.procs[p.PID]
			if ok && sameStart(old.Start, p.Start) {
				t.procs[p.PID] = p // the kernel's view, when started had to guess
				continue
			}
			if !ok && t.forking > 0 && p.PPID == t.self {
				continue // maybe a child not yet exec'd: started reports it
			}
			if ok && emit { // the pid was reused
				t.publish(proto.Event{Type: proto.EventProcessExited, Process: &old})
			}
			t.procs[p.PID] = p
			if emit {
				t.publish(proto.Event{Type: proto.EventProcessStarted, Process: &p})
			}
		}
		for pid, old := range t.procs {
			// The agent's own children are reported by exited, with their
			// exit status, when the reaper collects them.
			if !seen[pid] && old.PPID != t.self {
				delete(t.procs, pid)
				if emit {
					t.publish(proto.Event{Type: proto.EventProcessExited, Process: &old})
				}
			}
		}
	}
	ports, err := t.fs.Ports()
	if err != nil {
		return
	}
	seen := make(map[portKey]bool, len(ports))
	for _, p := range ports {
		k := keyOf(p)
		seen[k] = true
		if _, ok := t.ports[k]; !ok {
			t.ports[k] = p
			if emit {
				t.publish(proto.Event{Type: proto.EventPortOpened, Port: &p})
			}
		}
	}
	for k, p := range t.ports {
		if !seen[k] {
			delete(t.ports, k)
			if emit {
				t.publish(proto.Event{Type: proto.EventPortClosed, Port: &p})
			}
		}
	}
}

// publish hands e to every subscriber, counting it as lost for those whose
// queue is full.
func (t *tracker) publish(e proto.Event) {
	e.Time = time.Now()
	for s := range t.subs {
		select {
		case s.ch <- e:
		default:
			s.mu.Lock()
			s.lost++
			s.mu.Unlock()
		}
	}
}

// sameStart reports whether two start times of one pid are the same
// process's: the agent stamps a process it started with its own clock
// when /proc cannot be read yet, so they may differ by the time a fork
// and exec take, while a pid is reused only after the kernel has handed
// out every other one.
func sameStart(a, b time.Time) bool {
	d := a.Sub(b)
	return d < time.Second && d > -time.Second
}
