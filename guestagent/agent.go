package guestagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"tine/guestagent/procfs"
	"tine/guestagent/proto"
)

// Config configures an Agent.
type Config struct {
	// Root is the directory PutFile and GetFile paths are resolved in; no
	// path, symlink or ".." leaves it. Empty means "/".
	Root string
	// Proc reads processes and ports; nil means /proc and /etc/passwd.
	Proc *procfs.FS
	// ReapAll makes the agent reap every child, not only those it started:
	// set it when the agent is pid 1 or a child subreaper.
	ReapAll bool
	// ScanInterval is the fallback period at which the agent rescans
	// processes and ports while someone subscribes to events and nothing
	// else triggers a scan. Zero means 2s.
	ScanInterval time.Duration
	// OutputGrace is how long the agent keeps reading a process's output
	// after the process ended, for output that is still in flight or held
	// by a background child. Zero means 250ms.
	OutputGrace time.Duration
	// Hygiene lets the host send fork-hygiene requests (reseed the
	// kernel RNG, set the wall clock): set it only where the agent owns
	// its kernel, in a VM.
	Hygiene bool
}

// Agent serves the guest agent protocol: it lists processes and ports,
// streams events, runs commands and moves files.
type Agent struct {
	cfg    Config
	proc   *procfs.FS
	rootFD int
	reaper *reaper
	events *tracker

	mu    sync.Mutex
	execs map[*execution]struct{}
}

// New starts an agent. Close stops it.
func New(cfg Config) (*Agent, error) {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.Proc == nil {
		cfg.Proc = procfs.Default()
	}
	if cfg.ScanInterval <= 0 {
		cfg.ScanInterval = 2 * time.Second
	}
	if cfg.OutputGrace <= 0 {
		cfg.OutputGrace = 250 * time.Millisecond
	}
	fd, err := unix.Open(cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("guest agent: open root %s: %w", cfg.Root, err)
	}
	a := &Agent{cfg: cfg, proc: cfg.Proc, rootFD: fd, execs: map[*execution]struct{}{}}
	a.events = newTracker(cfg.Proc, cfg.ScanInterval)
	a.reaper = newReaper(cfg.ReapAll, func(st exitStatus) {
		a.events.exited(st.pid, exitOf(st, false))
	})
	return a, nil
}

// Close stops the reaper and the event scanner; it does not end processes
// (Terminate does).
func (a *Agent) Close() error {
	a.reaper.stop()
	a.events.stop()
	return unix.Close(a.rootFD)
}

// Terminate ends every process the agent started: SIGTERM to each process
// group, then SIGKILL to those still running after grace.
func (a *Agent) Terminate(grace time.Duration) {
	a.signalAll(unix.SIGTERM)
	deadline := time.Now().Add(grace)
	for a.running() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	a.signalAll(unix.SIGKILL)
}

func (a *Agent) signalAll(sig unix.Signal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for e := range a.execs {
		e.signal(sig, true)
	}
}

func (a *Agent) running() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.execs)
}

// Serve accepts connections on l until l is closed, serving each in its own
// goroutine.
func (a *Agent) Serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("guest agent: accept on %s: %w", l.Addr(), err)
		}
		go a.ServeConn(c)
	}
}

// handshakeTimeout bounds how long a connection may take to say hello.
const handshakeTimeout = 10 * time.Second

// ServeConn serves one connection until the peer closes it. Processes
// started over it keep running when it ends; their output is discarded.
func (a *Agent) ServeConn(rw io.ReadWriteCloser) error {
	c := &conn{a: a, rw: rw, streams: map[uint32]stream{}}
	defer rw.Close()
	if d, ok := rw.(interface{ SetReadDeadline(time.Time) error }); ok {
		d.SetReadDeadline(time.Now().Add(handshakeTimeout))
		defer d.SetReadDeadline(time.Time{})
	}
	f, err := proto.ReadFrame(rw)
	if err == nil {
		err = proto.CheckHello(f)
		if err != nil {
			c.fail(0, err)
		}
	}
	if err != nil {
		return fmt.Errorf("guest agent: %w", err)
	}
	if d, ok := rw.(interface{ SetReadDeadline(time.Time) error }); ok {
		d.SetReadDeadline(time.Time{})
	}
	if err := c.send(proto.HelloFrame()); err != nil {
		return fmt.Errorf("guest agent: send hello: %w", err)
	}
	defer c.closeStreams()
	for {
		f, err := proto.ReadFrame(rw)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("guest agent: %w", err)
		}
		c.handle(f)
	}
}

// stream is a request in progress that takes follow-up frames.
type stream interface {
	// frame handles a follow-up frame (stdin, signal, data, cancel...).
	frame(f proto.Frame)
	// close is called when the connection ends.
	close()
}

// conn is one host connection.
type conn struct {
	a  *Agent
	rw io.ReadWriteCloser

	wmu sync.Mutex
	mu  sync.Mutex
	// streams are the requests in progress by id.
	streams map[uint32]stream
	closed  bool
}

// send writes one frame; frames of concurrent streams never interleave.
func (c *conn) send(f proto.Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return proto.WriteFrame(c.rw, f)
}

func (c *conn) sendJSON(k proto.Kind, id uint32, v any) error {
	f, err := proto.JSONFrame(k, id, v)
	if err != nil {
		return err
	}
	return c.send(f)
}

// fail ends stream id with an error frame.
func (c *conn) fail(id uint32, err error) {
	e := proto.Error{Message: err.Error()}
	if se := (*startError)(nil); errors.As(err, &se) {
		e.Code = se.code
	}
	c.sendJSON(proto.KindError, id, e)
}

// register adds a stream; it fails when the id is in use.
func (c *conn) register(id uint32, s stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("connection is closing")
	}
	if _, dup := c.streams[id]; dup {
		return fmt.Errorf("request id %d is already in use by a running request", id)
	}
	c.streams[id] = s
	return nil
}

func (c *conn) unregister(id uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.streams, id)
}

func (c *conn) closeStreams() {
	c.mu.Lock()
	c.closed = true
	streams := c.streams
	c.streams = nil
	c.mu.Unlock()
	for _, s := range streams {
		s.close()
	}
}

// handle dispatches one frame from the host.
func (c *conn) handle(f proto.Frame) {
	switch f.Kind {
	case proto.KindPs:
		go c.list(f.ID, func() ([]any, error) { return asAny(c.a.proc.List()) })
	case proto.KindPorts:
		go c.list(f.ID, func() ([]any, error) { return asAny(c.a.proc.Ports()) })
	case proto.KindEvents:
		c.subscribe(f.ID)
	case proto.KindExec:
		var req proto.ExecRequest
		if err := proto.Decode(f, &req); err != nil {
			c.fail(f.ID, err)
			return
		}
		c.a.exec(c, f.ID, req)
	case proto.KindPut:
		var req proto.PutRequest
		if err := proto.Decode(f, &req); err != nil {
			c.fail(f.ID, err)
			return
		}
		c.a.put(c, f.ID, req)
	case proto.KindGet:
		var req proto.GetRequest
		if err := proto.Decode(f, &req); err != nil {
			c.fail(f.ID, err)
			return
		}
		c.a.get(c, f.ID, req)
	case proto.KindPutTree:
		var req proto.PutTreeRequest
		if err := proto.Decode(f, &req); err != nil {
			c.fail(f.ID, err)
			return
		}
		c.a.putTree(c, f.ID, req)
	case proto.KindGetTree:
		var req proto.GetTreeRequest
		if err := proto.Decode(f, &req); err != nil {
			c.fail(f.ID, err)
			return
		}
		c.a.getTree(c, f.ID, req)
	case proto.KindHygiene:
		go c.hygiene(f)
	case proto.KindStdin, proto.KindCloseStdin, proto.KindSignal, proto.KindResize, proto.KindData, proto.KindEnd, proto.KindCancel:
		c.mu.Lock()
		s := c.streams[f.ID]
		c.mu.Unlock()
		// A frame for a stream that just ended is not an error.
		if s != nil {
			s.frame(f)
		}
	default:
		c.fail(f.ID, fmt.Errorf("a %v frame is not a request the guest agent serves", f.Kind))
	}
}

func asAny[T any](items []T, err error) ([]any, error) {
	out := make([]any, len(items))
	for i := range items {
		out[i] = items[i]
	}
	return out, err
}

// list answers a ps or ports request: one Item frame per entry, then End.
func (c *conn) list(id uint32, read func() ([]any, error)) {
	items, err := read()
	if err != nil {
		c.fail(id, err)
		return
	}
	for _, it := range items {
		if err := c.sendJSON(proto.KindItem, id, it); err != nil {
			return
		}
	}
	c.send(proto.Frame{Kind: proto.KindEnd, ID: id})
}

// subscribe streams events to the host until it cancels or disconnects.
func (c *conn) subscribe(id uint32) {
	sub := c.a.events.subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.register(id, cancelStream(cancel)); err != nil {
		c.a.events.unsubscribe(sub)
		c.fail(id, err)
		return
	}
	go func() {
		defer c.unregister(id)
		defer c.a.events.unsubscribe(sub)
		for {
			select {
			case <-ctx.Done():
				c.send(proto.Frame{Kind: proto.KindEnd, ID: id})
				return
			case e := <-sub.ch:
				if err := c.sendJSON(proto.KindEvent, id, e); err != nil {
					return
				}
				if lost := sub.takeLost(); lost > 0 {
					if c.sendJSON(proto.KindEvent, id, proto.Event{Type: proto.EventLost, Time: time.Now(), Lost: lost}) != nil {
						return
					}
				}
			}
		}
	}()
}

// cancelStream is a stream whose only follow-up is Cancel.
type cancelStream context.CancelFunc

func (s cancelStream) frame(f proto.Frame) {
	if f.Kind == proto.KindCancel {
		s()
	}
}

func (s cancelStream) close() { s() }
