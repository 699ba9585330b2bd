package sandbox

import "sync"

// nameLocks is a mutex per sandbox name, kept only while someone holds
// or waits for it: work on one sandbox never waits on another's.
type nameLocks struct {
	mu    sync.Mutex
	locks map[string]*nameLock
}

type nameLock struct {
	sync.Mutex
	users int // holding or waiting
}

// lock locks name and returns its unlock.
func (n *nameLocks) lock(name string) func() {
	n.mu.Lock()
	if n.locks == nil {
		n.locks = map[string]*nameLock{}
	}
	l := n.locks[name]
	if l == nil {
		l = &nameLock{}
		n.locks[name] = l
	}
	l.users++
	n.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		n.mu.Lock()
		if l.users--; l.users == 0 {
			delete(n.locks, name)
		}
		n.mu.Unlock()
	}
}
