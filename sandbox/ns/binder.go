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
// The thread is one, locked for good: a goroutine that ends locked ends
// its thread, except the main thread, which the runtime parks forever,
// still in whatever namespace it was in (it would keep a sandbox's mounts,
// the project's FUSE mount among them, alive after the sandbox is gone).

// binder is the thread that binds.
type binder struct {
	once sync.Once
	mu   sync.Mutex
	err  error // why it cannot bind: set at its start, or when it could not go back
	reqs chan bindReq
}

type bindReq struct {
	pidfd, owner int
	fn           func() error
	done         chan error
}

var theBinder binder

// inNamespaces runs fn on the binder's thread in the mount and UTS
// namespaces of the process pidfd names, with the file system root and
// working directory those give. owner, unless -1, is the host uid and gid
// of the sandbox's root (in a user namespace): fn then makes files and
// mounts as that user, as the sandbox's own root would, since the host's
// root has no mapping in the idmapped layers.
func inNamespaces(pidfd, owner int, fn func() error) error {
	b := &theBinder
	b.once.Do(func() {
		b.reqs = make(chan bindReq)
		ready := make(chan error)
		go b.loop(ready)
		b.err = <-ready
	})
	b.mu.Lock()
	err := b.err
	b.mu.Unlock()
	if err != nil {
		return err
	}
	r := bindReq{pidfd: pidfd, owner: owner, fn: fn, done: make(chan error, 1)}
	b.reqs <- r
	return <-r.done
}

// loop is the binder's thread: it keeps descriptors of its own namespaces
// to go back to, and a file system context of its own (setns into a
// mount namespace wants one, and changes the root and working directory).
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
	ready <- nil
	for r := range b.reqs {
		err := enter(r)
		if back := goBack(ns, r.owner); back != nil {
			b.mu.Lock()
			b.err = fmt.Errorf("bind sandboxes: the binding thread could not go back to the host's namespaces: %w", back)
			b.mu.Unlock()
			r.done <- errors.Join(err, back)
			return
		}
		r.done <- err
	}
}

func enter(r bindReq) error {
	if err := unix.Setns(r.pidfd, unix.CLONE_NEWNS|unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("enter the sandbox's mount and UTS namespaces: %w", err)
	}
	if r.owner >= 0 {
		if err := actAs(r.owner); err != nil {
			return err
		}
	}
	return r.fn()
}

// goBack returns the binder's thread to the host's namespaces and to root.
func goBack(ns [2]int, owner int) error {
	if owner >= 0 {
		// Back to fsuid 0, the kernel makes the file system
		// capabilities effective again.
		unix.Setfsuid(0)
		unix.Setfsgid(0)
	}
	if err := unix.Setns(ns[0], unix.CLONE_NEWNS); err != nil {
		return err
	}
	return unix.Setns(ns[1], unix.CLONE_NEWUTS)
}

// actAs makes this thread's file system uid and gid id, and keeps its
// capabilities effective (setfsuid drops the file system ones), so that
// what it makes belongs to id and it still passes every permission check.
func actAs(id int) error {
	// setfsuid and setfsgid say only the previous id: ask again to check.
	unix.Setfsuid(id)
	unix.Setfsgid(id)
	uid, _ := unix.SetfsuidRetUid(-1)
	gid, _ := unix.SetfsgidRetGid(-1)
	if uid != id || gid != id {
		return fmt.Errorf("take file system uid and gid %d: have %d and %d", id, uid, gid)
	}
	h := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var d [2]unix.CapUserData
	if err := unix.Capget(&h, &d[0]); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	for i := range d {
		d[i].Effective = d[i].Permitted
	}
	if err := unix.Capset(&h, &d[0]); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	return nil
}
