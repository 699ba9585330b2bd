package ns

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// The host binds a warm instance to its sandbox from a thread of its own
// that enters the sandbox's mount and UTS namespaces, through a pidfd of
// its pid 1, and goes back to the host's after each bind (bind.go says
// what a bind does). See docs/adr/0185.
//
// The threads are a few, each locked for good: a goroutine that ends
// locked ends its thread, except the main thread, which the runtime parks
// forever, still in whatever namespace it was in (it would keep a
// sandbox's mounts, the project's FUSE mount among them, alive after the
// sandbox is gone). More than one lets the binds of a fork's sandboxes
// overlap instead of queueing on one thread (docs/adr/0212).

// binderThreads is how many threads bind at once.
var binderThreads = min(4, max(2, runtime.NumCPU()))

// binder is the threads that bind.
type binder struct {
	once   sync.Once
	err    error // why the threads could not start
	reqs   chan bindReq
	mu     sync.Mutex
	broken error // set once a thread could not go back: every bind fails
}

type bindReq struct {
	pidfd int
	ids   *idMap
	fn    func() error
	done  chan error
}

var theBinder binder

// inNamespaces runs fn on the binder's thread in the mount and UTS
// namespaces of the process pidfd names, with the file system root and
// working directory those give. With ids (a user namespace) fn runs as
// the sandbox's root (idMap.asSandboxRoot): the host's root has no
// mapping in the idmapped layers, so what fn makes must be the sandbox
// root's.
func inNamespaces(pidfd int, ids *idMap, fn func() error) error {
	b := &theBinder
	b.once.Do(func() {
		b.reqs = make(chan bindReq)
		ready := make(chan error)
		for range binderThreads {
			go b.loop(ready)
		}
		for range binderThreads {
			b.err = errors.Join(b.err, <-ready)
		}
	})
	if b.err != nil {
		return b.err
	}
	r := bindReq{pidfd: pidfd, ids: ids, fn: fn, done: make(chan error, 1)}
	b.reqs <- r
	return <-r.done
}

// loop is one of the binder's threads: it keeps descriptors of its own
// namespaces to go back to, and a file system context of its own (setns
// into a mount namespace wants one, and changes the root and working
// directory). Once one thread cannot go back, every thread answers every
// request with why.
func (b *binder) loop(ready chan<- error) {
	runtime.LockOSThread() // never unlocked
	var ns [2]int
	var err error
	for i, n := range []string{"mnt", "uts"} {
		if ns[i], err = unix.Open("/proc/thread-self/ns/"+n, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			ready <- fmt.Errorf("bind sandboxes: %w", err)
			return
		}
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		ready <- fmt.Errorf("bind sandboxes: unshare the file system context: %w", err)
		return
	}
	uid, _ := unix.SetfsuidRetUid(-1)
	gid, _ := unix.SetfsgidRetGid(-1)
	ready <- nil
	for r := range b.reqs {
		b.mu.Lock()
		broken := b.broken
		b.mu.Unlock()
		if broken != nil {
			r.done <- broken
			continue
		}
		err := enter(r)
		if back := goBack(ns, uid, gid); back != nil {
			broken = fmt.Errorf("bind sandboxes: a binding thread could not go back to the host's namespaces: %w", back)
			b.mu.Lock()
			b.broken = broken
			b.mu.Unlock()
			err = errors.Join(err, broken)
		}
		r.done <- err
	}
}

func enter(r bindReq) error {
	if err := unix.Setns(r.pidfd, unix.CLONE_NEWNS|unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("enter the sandbox's mount and UTS namespaces: %w", err)
	}
	if r.ids != nil {
		return r.ids.asSandboxRoot(r.fn)
	}
	return r.fn()
}

// goBack returns the binder's thread to the host's namespaces, and checks
// that its file system ids are uid and gid again.
func goBack(ns [2]int, uid, gid int) error {
	if u, _ := unix.SetfsuidRetUid(-1); u != uid {
		return fmt.Errorf("file system uid %d, not %d", u, uid)
	}
	if g, _ := unix.SetfsgidRetGid(-1); g != gid {
		return fmt.Errorf("file system gid %d, not %d", g, gid)
	}
	if err := unix.Setns(ns[0], unix.CLONE_NEWNS); err != nil {
		return err
	}
	return unix.Setns(ns[1], unix.CLONE_NEWUTS)
}
