package sandbox

import (
	"errors"
	"sync"
)

// errClosed is what an operation begun after Close returns.
var errClosed = errors.New("the sandbox manager is closed (the daemon is stopping); try again once it runs")

// ops counts the operations in flight that may start sandboxes (create,
// start, fork, rollback), so that Close waits for them and none starts a
// sandbox, or mounts its project, after Close has stopped the others.
type ops struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// enter begins an operation; the returned func ends it.
func (o *ops) enter() (func(), error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, errClosed
	}
	o.wg.Add(1)
	return o.wg.Done, nil
}

// close refuses new operations and waits for those in flight.
func (o *ops) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.wg.Wait()
}
