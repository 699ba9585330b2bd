package guestagent

import (
	"errors"
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// exitStatus is how a reaped child ended.
type exitStatus struct {
	pid    int
	status unix.WaitStatus
}

// reaper collects the exit status of children. It is the only caller of
// wait4 in the agent: the agent starts children with ForkExec and never
// with os/exec, so no status is taken by anyone else. A starter registers
// the pid of a new child under the reaper's lock, in the same critical
// section that forks it, so a child that exits at once is still given to
// its waiter and not mistaken for an orphan, and its start is reported
// before its exit.
type reaper struct {
	// all reaps every child (pid 1, or a child subreaper): orphans that the
	// kernel reparents to the agent are reaped too.
	all bool
	// onExit is called for every child reaped, before its waiter learns.
	onExit func(exitStatus)

	mu      sync.Mutex
	waiters map[int]chan exitStatus
	sigs    chan os.Signal
	done    chan struct{}
}

func newReaper(all bool, onExit func(exitStatus)) *reaper {
	r := &reaper{all: all, onExit: onExit, waiters: map[int]chan exitStatus{},
		sigs: make(chan os.Signal, 1), done: make(chan struct{})}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	return r
}

// start runs fork, which returns the pid of a new child, registers the
// child and calls started; the returned channel receives its exit status
// once.
func (r *reaper) start(fork func() (int, error), started func(pid int)) (int, <-chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitStatus, 1)
	r.waiters[pid] = ch
	started(pid)
	return pid, ch, nil
}

// children is the number of children started by start that still run.
func (r *reaper) children() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters)
}

func (r *reaper) stop() {
	signal.Stop(r.sigs)
	close(r.done)
}

// loop reaps on every SIGCHLD; it also reaps once at start for children
// that ended before the agent began to listen.
func (r *reaper) loop() {
	for {
		r.reap()
		select {
		case <-r.sigs:
		case <-r.done:
			return
		}
	}
}

// reap collects every child that has ended.
func (r *reaper) reap() {
	if !r.all {
		r.mu.Lock()
		pids := make([]int, 0, len(r.waiters))
		for pid := range r.waiters {
			pids = append(pids, pid)
		}
		r.mu.Unlock()
		for _, pid := range pids {
			r.wait(pid)
		}
		return
	}
	for r.wait(-1) {
	}
}

// wait reaps one child of pid (-1: any) without blocking, and reports
// whether it reaped one.
func (r *reaper) wait(pid int) bool {
	var ws unix.WaitStatus
	got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	for errors.Is(err, unix.EINTR) {
		got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
	if err != nil || got <= 0 {
		return false
	}
	st := exitStatus{pid: got, status: ws}
	r.mu.Lock()
	ch, ok := r.waiters[got]
	delete(r.waiters, got)
	r.mu.Unlock()
	r.onExit(st)
	if ok {
		ch <- st
	}
	return true
}
