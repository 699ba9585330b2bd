// Package client is the Go client of tine's API (package api): what the
// CLI uses to talk to the daemon, and what embedders use from their own
// programs.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"tine/api"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// maxResponseBytes bounds a JSON response the client decodes.
const maxResponseBytes = 64 << 20

// maxErrorBytes bounds the error body the client reads.
const maxErrorBytes = 64 << 10

// Client talks to one daemon over its Unix socket.
type Client struct {
	socket string
	http   *http.Client
}

// New returns a client of the daemon listening on socket. It does not
// connect until the first call.
func New(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:          16,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // exec and create may take long before their header
		DisableCompression:    true,
	}
	return &Client{socket: socket, http: &http.Client{Transport: tr}}
}

// Socket is the path of the daemon's socket.
func (c *Client) Socket() string { return c.socket }

// Error is an error response of the API; errors.Is matches it against
// the sandbox package's errors (ErrNotFound, ErrExists, ErrNotRunning) by
// its code.
type Error struct {
	Status  int
	Code    string
	Message string
	// ExitCode is, for an exec whose command did not start, the exit
	// status a shell gives (127 not found, 126 not executable or no such
	// working directory: api.CodeCommandNotFound and the others); else 0.
	ExitCode int
}

func (e *Error) Error() string { return e.Message }

// Is matches ErrNotFound to not_found, ErrExists to exists,
// ErrNotRunning to not_running and ErrDenied to denied.
func (e *Error) Is(target error) bool {
	switch target {
	case sandbox.ErrNotFound:
		return e.Code == "not_found"
	case sandbox.ErrExists:
		return e.Code == "exists"
	case sandbox.ErrNotRunning:
		return e.Code == "not_running"
	case sandbox.ErrDenied:
		return e.Code == "denied"
	}
	return false
}

// exitCode keeps an error's exit status when a process could have it
// (1-255), else 0.
func exitCode(n int) int {
	if n < 1 || n > 255 {
		return 0
	}
	return n
}

// base is the URL prefix of every request; the host is a placeholder.
const base = "http://tine/" + api.Version

// sandboxPath is the path of one sandbox's resource.
func sandboxPath(name string, rest ...string) string {
	return "/sandboxes/" + url.PathEscape(name) + strings.Join(rest, "")
}

// do sends a request and returns the response when its status is below
// 400; otherwise it returns the API's error.
func (c *Client) do(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tine daemon at %s: %w", c.socket, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, responseError(resp)
	}
	return resp, nil
}

// responseError decodes an error response.
func responseError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	e := &Error{Status: resp.StatusCode}
	var ae api.Error
	if json.Unmarshal(b, &ae) == nil && ae.Code != "" {
		e.Code, e.Message, e.ExitCode = ae.Code, ae.Message, exitCode(ae.ExitCode)
	} else {
		e.Code = "internal"
		e.Message = fmt.Sprintf("tine daemon answered %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return e
}

// call sends in (when not nil) as JSON and decodes the answer into out
// (when not nil).
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBytes))
		return nil
	}
	return decodeAnswer(method, path, resp.Body, out)
}

// decodeAnswer reads a JSON answer of at most maxResponseBytes into out.
func decodeAnswer(method, path string, body io.Reader, out any) error {
	b, err := io.ReadAll(io.LimitReader(body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("%s %s: read the answer: %w", method, path, err)
	}
	if len(b) > maxResponseBytes {
		return fmt.Errorf("%s %s: the answer exceeds %d bytes", method, path, maxResponseBytes)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decode the answer: %w", method, path, err)
	}
	return nil
}

// Ping reports whether the daemon answers.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Info(ctx)
	return err
}

// WaitReady waits until the daemon answers, or ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		err := c.Ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the tine daemon at %s: %w (last: %v)", c.socket, ctx.Err(), err)
		case <-time.After(delay):
		}
	}
}

// Info returns what the host can run.
func (c *Client) Info(ctx context.Context) (*api.Info, error) {
	var in api.Info
	return &in, c.call(ctx, "GET", "/info", nil, &in)
}

// Create makes and starts a sandbox.
func (c *Client) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, "POST", "/sandboxes", req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// List returns every sandbox.
func (c *Client) List(ctx context.Context) ([]api.Sandbox, error) {
	var out []api.Sandbox
	return out, c.call(ctx, "GET", "/sandboxes", nil, &out)
}

// ListInfo returns every sandbox's metadata alone: no process and port
// counts, usage or staleness, which List asks each running sandbox's
// agent and the host directory for.
func (c *Client) ListInfo(ctx context.Context) ([]api.Sandbox, error) {
	var out []api.Sandbox
	return out, c.call(ctx, "GET", "/sandboxes?status=false", nil, &out)
}

// Get returns one sandbox's status.
func (c *Client) Get(ctx context.Context, name string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.call(ctx, "GET", sandboxPath(name), nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Remove stops and deletes a sandbox.
func (c *Client) Remove(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", sandboxPath(name), nil, nil)
}

// Start starts a stopped sandbox; Stop stops a running one.
func (c *Client) Start(ctx context.Context, name string) error {
	return c.call(ctx, "POST", sandboxPath(name, "/start"), nil, nil)
}

// Stop stops a running sandbox; its files stay.
func (c *Client) Stop(ctx context.Context, name string) error {
	return c.call(ctx, "POST", sandboxPath(name, "/stop"), nil, nil)
}

// Fork makes new sandboxes from a snapshot of name taken now.
func (c *Client) Fork(ctx context.Context, name string, req api.ForkRequest) ([]api.Sandbox, error) {
	var out []api.Sandbox
	return out, c.call(ctx, "POST", sandboxPath(name, "/fork"), req, &out)
}

// Snapshot fixes the sandbox's files at this instant.
func (c *Client) Snapshot(ctx context.Context, name string, req api.SnapshotRequest) (*sandbox.SnapshotInfo, error) {
	var s sandbox.SnapshotInfo
	if err := c.call(ctx, "POST", sandboxPath(name, "/snapshots"), req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Snapshots lists a sandbox's snapshots.
func (c *Client) Snapshots(ctx context.Context, name string) ([]sandbox.SnapshotInfo, error) {
	var out []sandbox.SnapshotInfo
	return out, c.call(ctx, "GET", sandboxPath(name, "/snapshots"), nil, &out)
}

// Rollback returns the sandbox to one of its snapshots.
func (c *Client) Rollback(ctx context.Context, name string, req api.RollbackRequest) error {
	return c.call(ctx, "POST", sandboxPath(name, "/rollback"), req, nil)
}

// Diff lists the sandbox's changes since snap ("" for its origin). A
// diff of any size is taken whole; DiffEach walks one without holding it.
func (c *Client) Diff(ctx context.Context, name, snap string) ([]api.Change, error) {
	var out []api.Change
	return out, c.DiffEach(ctx, name, snap, func(ch api.Change) error {
		out = append(out, ch)
		return nil
	})
}

// DiffEach calls fn with each of the sandbox's changes since snap ("" for
// its origin) as the daemon sends them; fn's error stops the walk and is
// returned. A response cut short (the daemon failed part way) is an
// error, after fn saw the changes before the cut.
func (c *Client) DiffEach(ctx context.Context, name, snap string, fn func(api.Change) error) error {
	p := sandboxPath(name, "/diff")
	if snap != "" {
		p += "?snapshot=" + url.QueryEscape(snap)
	}
	resp, err := c.do(ctx, "GET", p, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := decodeArray(resp.Body, fn); err != nil {
		return fmt.Errorf("GET %s: %w", p, err)
	}
	return nil
}

// decodeArray decodes a JSON array from r one element at a time, calling
// fn with each.
func decodeArray[T any](r io.Reader, fn func(T) error) error {
	dec := json.NewDecoder(r)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return fmt.Errorf("the answer is not a JSON array (%v, %v)", tok, err)
	}
	for dec.More() {
		var v T
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("decode the answer: %w", err)
		}
		if err := fn(v); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("decode the answer: %w", err)
	}
	return nil
}

// Promote applies the sandbox's changes to the directory it came from.
func (c *Client) Promote(ctx context.Context, name string, req api.PromoteRequest) (*api.PromoteResponse, error) {
	var out api.PromoteResponse
	if err := c.call(ctx, "POST", sandboxPath(name, "/promote"), req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Ps lists the sandbox's processes.
func (c *Client) Ps(ctx context.Context, name string) ([]proto.Process, error) {
	var out []proto.Process
	return out, c.call(ctx, "GET", sandboxPath(name, "/ps"), nil, &out)
}

// Ports lists the sandbox's listening sockets.
func (c *Client) Ports(ctx context.Context, name string) ([]proto.Port, error) {
	var out []proto.Port
	return out, c.call(ctx, "GET", sandboxPath(name, "/ports"), nil, &out)
}

// Logs streams the output of the sandbox's services.
func (c *Client) Logs(ctx context.Context, name string, o sandbox.LogOptions) (io.ReadCloser, error) {
	q := url.Values{}
	if o.Follow {
		q.Set("follow", "1")
	}
	if o.Tail > 0 {
		q.Set("tail", strconv.Itoa(o.Tail))
	}
	p := sandboxPath(name, "/logs")
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	resp, err := c.do(ctx, "GET", p, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Events streams the sandbox's process and port events until ctx ends.
func (c *Client) Events(ctx context.Context, name string) (<-chan proto.Event, error) {
	resp, err := c.do(ctx, "GET", sandboxPath(name, "/events"), nil, "")
	if err != nil {
		return nil, err
	}
	out := make(chan proto.Event, 64)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		lr := newLineReader(resp.Body)
		for {
			line, err := lr.next()
			if err != nil {
				return
			}
			var ev proto.Event
			if json.Unmarshal(line, &ev) != nil {
				continue
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// PutFile writes a file in the sandbox; GetFile reads one.
func (c *Client) PutFile(ctx context.Context, name, path string, mode uint32, r io.Reader) error {
	q := url.Values{"path": {path}, "mode": {strconv.FormatUint(uint64(mode&0o7777), 8)}}
	resp, err := c.do(ctx, "PUT", sandboxPath(name, "/files?"+q.Encode()), r, "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// GetFile copies a file of the sandbox to w.
func (c *Client) GetFile(ctx context.Context, name, path string, w io.Writer) error {
	return c.download(ctx, name, "/files", path, w)
}

// download copies what GET route?path=P of sandbox name answers to w.
func (c *Client) download(ctx context.Context, name, route, path string, w io.Writer) error {
	q := url.Values{"path": {path}}
	resp, err := c.do(ctx, "GET", sandboxPath(name, route+"?"+q.Encode()), nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("get %s from sandbox %q: %w", path, name, err)
	}
	return nil
}

// PutArchive copies a tar stream of one file or directory tree into the
// sandbox at path: inside it when path is an existing directory (required
// when into is set), as path otherwise. It returns the copy's path.
func (c *Client) PutArchive(ctx context.Context, name, path string, into bool, r io.Reader) (string, error) {
	q := url.Values{"path": {path}}
	if into {
		q.Set("into", "true")
	}
	p := sandboxPath(name, "/archive?"+q.Encode())
	resp, err := c.do(ctx, "PUT", p, r, "application/x-tar")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out api.ArchivePut
	if err := decodeAnswer("PUT", p, resp.Body, &out); err != nil {
		return "", err
	}
	return out.Path, nil
}

// GetArchive copies the file, symlink or directory tree at path in the
// sandbox to w as a tar stream whose top entry is path's last element. An
// error means w may hold a cut stream.
func (c *Client) GetArchive(ctx context.Context, name, path string, w io.Writer) error {
	return c.download(ctx, name, "/archive", path, w)
}

// FS runs one "tine fs" command in the daemon and returns its output.
func (c *Client) FS(ctx context.Context, command string, req api.FSRequest) (*api.FSResponse, error) {
	var out api.FSResponse
	if err := c.call(ctx, "POST", "/fs/"+url.PathEscape(command), req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
