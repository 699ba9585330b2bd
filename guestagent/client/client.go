// Package client is the host's side of the guest agent protocol. Every
// frame the agent sends is untrusted: frames are bounded by the protocol,
// lists and events by MaxListBytes and proto.MaxItemBytes, and buffered
// output by outputBuffer per stream, whatever the agent sends.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"tine/guestagent/proto"
)

// MaxListBytes bounds the encoded size of one Ps or Ports answer.
const MaxListBytes = 16 << 20

// maxMessage bounds the text of an agent's error that the client keeps.
const maxMessage = 4096

// streamQueue is how many frames of one stream wait for its reader; a full
// queue stops the connection's reader until the stream's reader catches up.
const streamQueue = 4

// ErrClosed is returned by calls on a closed client or a dropped connection.
var ErrClosed = errors.New("guest agent connection is closed")

// Client is a connection to a guest agent. Its methods may be called from
// several goroutines; requests run concurrently over the one connection.
type Client struct {
	conn io.ReadWriteCloser

	wmu chan struct{} // holds a token while a frame is written
	mu  sync.Mutex
	// streams are the requests in progress, by id.
	streams map[uint32]*stream
	nextID  uint32
	err     error
	done    chan struct{}
}

// stream is one request's incoming frames.
type stream struct {
	id   uint32
	ch   chan proto.Frame
	done chan struct{} // closed when the request is forgotten
}

// Dial connects to an agent listening on the Unix socket at path. The
// socket itself must be there: a symlink in its place is not followed
// (connect would follow it), since a sandbox that can write where its
// agent's socket lies could point it at any socket of the host.
func Dial(ctx context.Context, socket string) (*Client, error) {
	fd, err := unix.Open(socket, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dial guest agent: %w", &os.PathError{Op: "open", Path: socket, Err: err})
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("dial guest agent: %w", &os.PathError{Op: "stat", Path: socket, Err: err})
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("dial guest agent: %w", &os.PathError{Op: "dial", Path: socket, Err: unix.ENOTSOCK})
	}
	// Through the descriptor: the socket that was looked at, not
	// whatever the path names by now.
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, fmt.Errorf("dial guest agent at %s: %w", socket, err)
	}
	return New(conn)
}

// handshakeTimeout bounds the agent's answer to the hello.
const handshakeTimeout = 10 * time.Second

// New runs the handshake over conn and returns a client that owns it.
func New(conn io.ReadWriteCloser) (*Client, error) {
	fail := func(err error) (*Client, error) {
		conn.Close()
		return nil, fmt.Errorf("guest agent handshake: %w", err)
	}
	if err := proto.WriteFrame(conn, proto.HelloFrame()); err != nil {
		return fail(err)
	}
	type deadliner interface{ SetReadDeadline(time.Time) error }
	if d, ok := conn.(deadliner); ok {
		d.SetReadDeadline(time.Now().Add(handshakeTimeout))
	}
	f, err := proto.ReadFrame(conn)
	if err == nil {
		err = proto.CheckHello(f)
	}
	if err != nil {
		return fail(err)
	}
	if d, ok := conn.(deadliner); ok {
		d.SetReadDeadline(time.Time{})
	}
	c := &Client{conn: conn, wmu: make(chan struct{}, 1), streams: map[uint32]*stream{}, done: make(chan struct{})}
	go c.readLoop()
	return c, nil
}

// Close closes the connection; calls in progress return ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

// Done is closed once the connection has ended (closed, or dropped by
// the agent).
func (c *Client) Done() <-chan struct{} { return c.done }

// readLoop hands each frame to its stream until the connection ends.
func (c *Client) readLoop() {
	var err error
	for {
		var f proto.Frame
		f, err = proto.ReadFrame(c.conn)
		if err != nil {
			break
		}
		if f.ID == 0 {
			if f.Kind == proto.KindError {
				err = agentError(f)
				break
			}
			continue
		}
		c.mu.Lock()
		s := c.streams[f.ID]
		c.mu.Unlock()
		if s == nil {
			continue // a request the caller gave up on
		}
		select {
		case s.ch <- f:
		case <-s.done:
		}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = ErrClosed
	} else {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	c.conn.Close()
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	close(c.done)
}

// agentError is the error an Error frame carries.
func agentError(f proto.Frame) error {
	var e proto.Error
	if err := proto.Decode(f, &e); err != nil {
		return err
	}
	if len(e.Message) > maxMessage {
		e.Message = e.Message[:maxMessage] + "..."
	}
	if proto.ExecExitStatus(e.Code) == 0 {
		e.Code = "" // a code this side does not know is none
	}
	return &AgentError{Message: e.Message, Code: e.Code}
}

// AgentError is an error the agent answered (not a broken connection):
// the request reached it and failed there.
type AgentError struct {
	Message string
	// Code is the error's proto.Code* value (an exec that did not start:
	// proto.CodeNotFound, CodeNotExecutable, CodeBadDir), or empty.
	Code string
}

func (e *AgentError) Error() string { return "guest agent: " + e.Message }

// ExitStatus is the exit status a shell gives the failure: 127 or 126
// for an exec that did not start (proto.ExecExitStatus), else 0.
func (e *AgentError) ExitStatus() int { return proto.ExecExitStatus(e.Code) }

// open starts a request: it registers a new stream and sends f with its id.
func (c *Client) open(ctx context.Context, k proto.Kind, v any) (*stream, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.nextID++
	if c.nextID == 0 {
		c.nextID = 1
	}
	s := &stream{id: c.nextID, ch: make(chan proto.Frame, streamQueue), done: make(chan struct{})}
	c.streams[s.id] = s
	c.mu.Unlock()
	f := proto.Frame{Kind: k, ID: s.id}
	if v != nil {
		var err error
		if f, err = proto.JSONFrame(k, s.id, v); err != nil {
			c.forget(s)
			return nil, err
		}
	}
	if err := c.send(ctx, f); err != nil {
		c.forget(s)
		return nil, err
	}
	return s, nil
}

// forget drops a stream; later frames for it are discarded.
func (c *Client) forget(s *stream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.streams[s.id]; ok {
		delete(c.streams, s.id)
		close(s.done)
	}
}

// writeTimeout bounds the write of one frame: an agent that has not
// taken a frame in this long has stopped reading (a sandbox's root can
// take its agent over, and a frozen one reads nothing), and would
// otherwise hold the writer, and every call queued behind it, forever.
var writeTimeout = 30 * time.Second

// send writes f. Waiting for the connection, or for an agent that does not
// read, ends with ctx or writeTimeout: a frame cut short that way leaves
// the stream unusable, so the connection is closed (later calls get
// ErrClosed).
func (c *Client) send(ctx context.Context, f proto.Frame) error {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	select {
	case c.wmu <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("send %v: %w", f.Kind, ctx.Err())
	case <-c.done:
		return fmt.Errorf("%w: send %v", ErrClosed, f.Kind)
	}
	defer func() { <-c.wmu }()
	type deadliner interface{ SetWriteDeadline(time.Time) error }
	var cut sync.Mutex // orders the cut against the end of the write
	written := false
	stop := context.AfterFunc(ctx, func() {
		cut.Lock()
		defer cut.Unlock()
		if written {
			return
		}
		if d, ok := c.conn.(deadliner); ok {
			d.SetWriteDeadline(time.Unix(1, 0))
		} else {
			c.conn.Close()
		}
	})
	err := proto.WriteFrame(c.conn, f)
	cut.Lock()
	written = true
	cut.Unlock()
	if !stop() { // ctx ended during the write: the cut is done, or never will be
		if err != nil {
			c.conn.Close()
			return fmt.Errorf("%w: send %v: %w", ErrClosed, f.Kind, ctx.Err())
		}
		if d, ok := c.conn.(deadliner); ok {
			d.SetWriteDeadline(time.Time{})
		}
	}
	if err != nil {
		return fmt.Errorf("%w: send %v: %w", ErrClosed, f.Kind, err)
	}
	return nil
}

// refusal is the agent's error on stream s when it sent one before the
// connection ended (an agent refuses a request, then may hang up), else
// err, the failure of a send on s. The connection's end is waited for,
// briefly, so that what the agent sent before it is delivered.
func (c *Client) refusal(s *stream, err error) error {
	if !errors.Is(err, ErrClosed) {
		return err
	}
	select {
	case <-c.done:
	case <-time.After(time.Second):
	}
	select {
	case f := <-s.ch:
		if f.Kind == proto.KindError {
			return agentError(f)
		}
	default:
	}
	return err
}

// sendBounded is send for frames no caller's context covers.
func (c *Client) sendBounded(f proto.Frame) error { return c.send(context.Background(), f) }

// recv waits for the stream's next frame. An Error frame becomes an error.
func (c *Client) recv(ctx context.Context, s *stream) (proto.Frame, error) {
	select {
	case f := <-s.ch:
		if f.Kind == proto.KindError {
			return f, agentError(f)
		}
		return f, nil
	case <-ctx.Done():
		return proto.Frame{}, ctx.Err()
	case <-c.done:
		// Frames that arrived before the end are still delivered.
		select {
		case f := <-s.ch:
			if f.Kind == proto.KindError {
				return f, agentError(f)
			}
			return f, nil
		default:
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return proto.Frame{}, c.err
	}
}

// Ps lists the processes in the agent's pid namespace.
func (c *Client) Ps(ctx context.Context) ([]proto.Process, error) {
	return list[proto.Process](ctx, c, proto.KindPs)
}

// Ports lists the listening sockets in the agent's network namespace.
func (c *Client) Ports(ctx context.Context) ([]proto.Port, error) {
	return list[proto.Port](ctx, c, proto.KindPorts)
}

func list[T any](ctx context.Context, c *Client, k proto.Kind) ([]T, error) {
	s, err := c.open(ctx, k, nil)
	if err != nil {
		return nil, err
	}
	defer c.forget(s)
	var items []T
	total := 0
	for {
		f, err := c.recv(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", k, err)
		}
		switch f.Kind {
		case proto.KindEnd:
			return items, nil
		case proto.KindItem:
			total += len(f.Payload)
			if len(f.Payload) > proto.MaxItemBytes || total > MaxListBytes {
				return nil, fmt.Errorf("%v: the agent's answer exceeds %d bytes per item or %d in all; refused",
					k, proto.MaxItemBytes, MaxListBytes)
			}
			var it T
			if err := proto.Decode(f, &it); err != nil {
				return nil, fmt.Errorf("%v: %w", k, err)
			}
			items = append(items, it)
		}
	}
}

// eventQueue is how many events wait for the reader of Events.
const eventQueue = 256

// maxLost bounds the count of a "lost" event: the agent's are refused
// past it, and the client's count stops there.
const maxLost = 1 << 30

// Events streams what changes in the sandbox: processes starting and
// exiting, ports opening and closing. The channel is closed when ctx ends
// or the connection drops. A caller that reads too slowly never stalls
// the connection (the execs and lists that share it go on): once
// eventQueue events wait, newer ones are dropped and counted, and a
// "lost" event says how many when there is room again, as the agent does
// for a host that reads too slowly. An event the agent may not send (see
// agentEvent) is dropped like one that does not decode.
func (c *Client) Events(ctx context.Context) (<-chan proto.Event, error) {
	s, err := c.open(ctx, proto.KindEvents, nil)
	if err != nil {
		return nil, err
	}
	out := make(chan proto.Event, eventQueue)
	go func() {
		defer close(out)
		defer c.forget(s)
		lost := 0
		for {
			f, err := c.recv(ctx, s)
			if err != nil {
				if ctx.Err() != nil {
					c.sendBounded(proto.Frame{Kind: proto.KindCancel, ID: s.id})
				}
				return
			}
			if f.Kind == proto.KindEnd {
				return
			}
			var e proto.Event
			if f.Kind != proto.KindEvent || len(f.Payload) > proto.MaxItemBytes || proto.Decode(f, &e) != nil {
				continue
			}
			e, ok := agentEvent(e)
			if !ok {
				continue
			}
			if lost > 0 && offer(out, proto.Event{Type: proto.EventLost, Time: time.Now(), Lost: lost}) {
				lost = 0
			}
			if lost > 0 || !offer(out, e) {
				lost = min(lost+eventCount(e), maxLost)
			}
		}
	}()
	return out, nil
}

// agentEvent checks an event from the agent, which is untrusted: it must
// be of a type the agent sends (not one the host adds to the stream, such
// as an OOM kill) and carry what that type needs. Fields of other types
// are cleared, and so is what only the daemon may say of an exit
// (proto.Exit.KilledBy, as for Exec).
func agentEvent(e proto.Event) (proto.Event, bool) {
	v := proto.Event{Type: e.Type, Time: e.Time}
	switch e.Type {
	case proto.EventProcessStarted, proto.EventProcessExited:
		v.Process = e.Process
		if e.Exit != nil && e.Type == proto.EventProcessExited {
			x := *e.Exit
			x.KilledBy, x.KilledReason = "", ""
			v.Exit = &x
		}
		return v, e.Process != nil
	case proto.EventPortOpened, proto.EventPortClosed:
		v.Port = e.Port
		return v, e.Port != nil
	case proto.EventLost:
		v.Lost = e.Lost
		return v, e.Lost > 0 && e.Lost < maxLost
	}
	return v, false
}

// offer sends e on out unless out is full.
func offer(out chan<- proto.Event, e proto.Event) bool {
	select {
	case out <- e:
		return true
	default:
		return false
	}
}

// eventCount is how many events e (checked by agentEvent) stands for.
func eventCount(e proto.Event) int {
	if e.Type == proto.EventLost {
		return e.Lost
	}
	return 1
}
