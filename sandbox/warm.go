package sandbox

import (
	"context"
	"io"
)

// Warmer is a Runtime that can start sandboxes ahead of time, so that
// Start only binds one to its sandbox.
type Warmer interface {
	// Warm keeps o.N sandboxes started ahead of time until the result is
	// closed; Start uses them for sandboxes whose state directory does not
	// exist yet.
	Warm(ctx context.Context, o WarmOptions) (io.Closer, error)
}

// WarmOptions says how many sandboxes a Warmer keeps started and where.
type WarmOptions struct {
	// Dir holds their state; it is on the same file system as the
	// sandboxes' state directories.
	Dir string
	// N is how many to keep.
	N int
	// Layers, if not empty, holds what the sandboxes made from one
	// snapshot share (an ns fork's stacked OS layer, ADR 0215), N 0
	// included; it is on the same file system and kept across restarts.
	Layers string
}

// A Sweeper is a Runtime that keeps, beside its sandboxes' state
// directories, what several of them share. Sweep removes what no state
// directory refers to any more; the Manager calls it after it removes
// one.
type Sweeper interface {
	Sweep() error
}
