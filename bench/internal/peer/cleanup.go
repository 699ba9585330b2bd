// Package peer runs the systems tine is measured against: btrfs on a loop
// device, kernel overlayfs, fuse-overlayfs, git and plain commands. Every
// resource it makes (mount, loop device, process, directory) is registered
// with a Cleanups stack so that a benchmark leaves nothing behind, even when
// it fails or is interrupted.
package peer

import (
	"errors"
	"fmt"
	"sync"
)

// Cleanups is a stack of undo steps, run last-in first-out. It is safe for
// concurrent use. The zero value is ready to use.
type Cleanups struct {
	mu    sync.Mutex
	steps []cleanupStep
}

type cleanupStep struct {
	what string
	fn   func() error
}

// Add pushes an undo step; what names the resource in error messages.
func (c *Cleanups) Add(what string, fn func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steps = append(c.steps, cleanupStep{what, fn})
}

// Run pops and runs every step, newest first, and returns the joined
// errors of the steps that failed. Later steps still run after a failure.
func (c *Cleanups) Run() error {
	var errs []error
	for {
		c.mu.Lock()
		if len(c.steps) == 0 {
			c.mu.Unlock()
			return errors.Join(errs...)
		}
		s := c.steps[len(c.steps)-1]
		c.steps = c.steps[:len(c.steps)-1]
		c.mu.Unlock()
		if err := s.fn(); err != nil {
			errs = append(errs, fmt.Errorf("clean up %s: %w", s.what, err))
		}
	}
}

// Len reports how many undo steps are pending.
func (c *Cleanups) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.steps)
}
