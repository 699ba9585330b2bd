package sandbox

import (
	"context"
	"errors"
	"io"

	"tine/cowfs"
)

// errTODO marks a method whose body is still to be written.
var errTODO = errors.New("not implemented yet")

// Status returns a sandbox's metadata with its live state and staleness.
func (m *Manager) Status(ctx context.Context, name string) (*Status, error) { return nil, errTODO }

// Snapshots lists a sandbox's snapshots, oldest first.
func (m *Manager) Snapshots(name string) ([]*SnapshotInfo, error) { return nil, errTODO }

// LogOptions says which part of a sandbox's service output to read.
type LogOptions struct {
	// Follow keeps the stream open for output written later, until ctx ends
	// or the sandbox stops.
	Follow bool
	// Tail, when positive, starts this many lines before the end.
	Tail int
}

// Logs returns the output of the sandbox's services.
func (m *Manager) Logs(ctx context.Context, name string, o LogOptions) (io.ReadCloser, error) {
	return nil, errTODO
}

// Promote applies the sandbox's project changes since its origin to the
// host directory it was created from, after a conflict check (see
// cowfs.Promote).
func (m *Manager) Promote(ctx context.Context, name string, o cowfs.PromoteOptions) (*cowfs.PromoteResult, error) {
	return nil, errTODO
}
