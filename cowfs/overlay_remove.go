package cowfs

import (
	"os"
	"sync"
)

// overlayRemover deletes overlay files that are no longer needed (of an
// unlinked file, or of a file whose bytes a commit stored) off the
// request path: an unlink on the host disk costs more than the FUSE
// request that caused it, so `rm -rf` of freshly written files waited
// for it. Paths are never reused while queued (an overlay's name holds
// the inode number and a number the branch never gives twice while it
// is open), and a branch drains its queue before it closes or opens
// again, so a later mount never sees a path disappear. Files left by a
// crash are removed when the branch is next opened.
type overlayRemover struct {
	mu    sync.Mutex
	queue chan string
	done  chan struct{}
}

// removeQueue bounds the paths waiting; beyond it, removal is synchronous.
const removeQueue = 4096

// remove deletes path, soon.
func (r *overlayRemover) remove(path string) {
	r.mu.Lock()
	if r.queue == nil {
		r.queue, r.done = make(chan string, removeQueue), make(chan struct{})
		go func(q chan string, done chan struct{}) {
			for p := range q {
				os.Remove(p)
			}
			close(done)
		}(r.queue, r.done)
	}
	select {
	case r.queue <- path:
		r.mu.Unlock()
	default:
		r.mu.Unlock()
		os.Remove(path)
	}
}

// drain waits until every queued path is removed.
func (r *overlayRemover) drain() {
	r.mu.Lock()
	q, done := r.queue, r.done
	r.queue, r.done = nil, nil
	r.mu.Unlock()
	if q != nil {
		close(q)
		<-done
	}
}
