// Package client is the Go client of tine's API (package api): what the
// CLI uses to talk to the daemon, and what embedders use from their own
// programs.
package client

import (
	"context"
	"errors"
	"io"

	"tine/api"
	"tine/guestagent/proto"
	"tine/sandbox"
)

var errTODO = errors.New("not implemented yet")

// Client talks to one daemon over its Unix socket.
type Client struct {
	socket string
}

// New returns a client of the daemon listening on socket. It does not
// connect until the first call.
func New(socket string) *Client { return &Client{socket: socket} }

// Error is an error response of the API; errors.Is matches it against
// the sandbox package's errors (ErrNotFound, ErrExists, ErrNotRunning) by
// its code.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Ping reports whether the daemon answers.
func (c *Client) Ping(ctx context.Context) error { return errTODO }

// Info returns what the host can run.
func (c *Client) Info(ctx context.Context) (*api.Info, error) { return nil, errTODO }

// Create makes and starts a sandbox.
func (c *Client) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	return nil, errTODO
}

// List returns every sandbox.
func (c *Client) List(ctx context.Context) ([]api.Sandbox, error) { return nil, errTODO }

// Get returns one sandbox's status.
func (c *Client) Get(ctx context.Context, name string) (*api.Sandbox, error) { return nil, errTODO }

// Remove stops and deletes a sandbox.
func (c *Client) Remove(ctx context.Context, name string) error { return errTODO }

// Start starts a stopped sandbox; Stop stops a running one.
func (c *Client) Start(ctx context.Context, name string) error { return errTODO }

// Stop stops a running sandbox; its files stay.
func (c *Client) Stop(ctx context.Context, name string) error { return errTODO }

// Fork makes new sandboxes from a snapshot of name taken now.
func (c *Client) Fork(ctx context.Context, name string, req api.ForkRequest) ([]api.Sandbox, error) {
	return nil, errTODO
}

// Snapshot fixes the sandbox's files at this instant.
func (c *Client) Snapshot(ctx context.Context, name string, req api.SnapshotRequest) (*sandbox.SnapshotInfo, error) {
	return nil, errTODO
}

// Snapshots lists a sandbox's snapshots.
func (c *Client) Snapshots(ctx context.Context, name string) ([]sandbox.SnapshotInfo, error) {
	return nil, errTODO
}

// Rollback returns the sandbox to one of its snapshots.
func (c *Client) Rollback(ctx context.Context, name string, req api.RollbackRequest) error {
	return errTODO
}

// Diff lists the sandbox's changes since snap ("" for its origin).
func (c *Client) Diff(ctx context.Context, name, snap string) ([]api.Change, error) {
	return nil, errTODO
}

// Promote applies the sandbox's changes to the directory it came from.
func (c *Client) Promote(ctx context.Context, name string, req api.PromoteRequest) (*api.PromoteResponse, error) {
	return nil, errTODO
}

// Ps lists the sandbox's processes.
func (c *Client) Ps(ctx context.Context, name string) ([]proto.Process, error) { return nil, errTODO }

// Ports lists the sandbox's listening sockets.
func (c *Client) Ports(ctx context.Context, name string) ([]proto.Port, error) {
	return nil, errTODO
}

// Logs streams the output of the sandbox's services.
func (c *Client) Logs(ctx context.Context, name string, o sandbox.LogOptions) (io.ReadCloser, error) {
	return nil, errTODO
}

// Events streams the sandbox's process and port events until ctx ends.
func (c *Client) Events(ctx context.Context, name string) (<-chan proto.Event, error) {
	return nil, errTODO
}

// ExecIO connects an exec to the caller's streams. Stdin may be nil.
// Resize, when not nil, delivers window sizes for a TTY.
type ExecIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Resize         <-chan proto.Resize
	Signals        <-chan proto.Signal
}

// Exec runs a command in the sandbox, streams its output to io, and
// returns how it ended. With stdin, a TTY, resizes or signals it uses the
// interactive (WebSocket) endpoint.
func (c *Client) Exec(ctx context.Context, name string, req api.ExecRequest, io ExecIO) (proto.Exit, error) {
	return proto.Exit{}, errTODO
}

// PutFile writes a file in the sandbox; GetFile reads one.
func (c *Client) PutFile(ctx context.Context, name, path string, mode uint32, r io.Reader) error {
	return errTODO
}

// GetFile copies a file of the sandbox to w.
func (c *Client) GetFile(ctx context.Context, name, path string, w io.Writer) error { return errTODO }

// FS runs one "tine fs" command in the daemon and returns its output.
func (c *Client) FS(ctx context.Context, command string, req api.FSRequest) (*api.FSResponse, error) {
	return nil, errTODO
}
