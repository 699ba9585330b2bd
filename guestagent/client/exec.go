package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"

	"tine/guestagent/proto"
)

// outputBuffer bounds the output of one stream that waits for its reader;
// when it is full the connection's reader waits too.
const outputBuffer = 1 << 20

// Process is a command running in the sandbox.
type Process struct {
	// PID is the process's pid in the sandbox.
	PID int
	// Stdout is the process's standard output (with a TTY: the terminal's
	// output); Stderr its standard error (empty with a TTY). Read both, or
	// a full buffer stalls the connection.
	Stdout, Stderr io.Reader
	// Stdin is the process's standard input; Close sends end of input.
	Stdin io.WriteCloser

	c       *Client
	s       *stream
	window  chan struct{} // one token per Stdin frame not yet acknowledged
	stdout  *pipe
	stderr  *pipe
	done    chan struct{}
	exit    proto.Exit
	err     error
	stdinMu sync.Mutex
}

// Exec starts a command. Cancelling ctx kills the command's process group.
func (c *Client) Exec(ctx context.Context, req proto.ExecRequest) (*Process, error) {
	s, err := c.open(ctx, proto.KindExec, req)
	if err != nil {
		return nil, err
	}
	f, err := c.recv(ctx, s)
	if err == nil && f.Kind != proto.KindStarted {
		err = fmt.Errorf("the agent answered exec with %v, want started", f.Kind)
	}
	var st proto.Started
	if err == nil {
		err = proto.Decode(f, &st)
	}
	if err != nil {
		if ctx.Err() != nil {
			c.sendBounded(proto.Frame{Kind: proto.KindCancel, ID: s.id})
		}
		c.forget(s)
		return nil, fmt.Errorf("exec %q: %w", req.Argv, err)
	}
	p := &Process{PID: st.PID, c: c, s: s, window: make(chan struct{}, proto.StdinWindow),
		stdout: newPipe(), stderr: newPipe(), done: make(chan struct{})}
	p.Stdout, p.Stderr, p.Stdin = p.stdout, p.stderr, stdin{p}
	go p.demux(ctx)
	return p, nil
}

// demux sorts the stream's frames until the exit arrives.
func (p *Process) demux(ctx context.Context) {
	defer close(p.done)
	defer p.c.forget(p.s)
	cancelled := false
	for {
		f, err := p.c.recv(ctx, p.s)
		if err != nil && ctx.Err() != nil && !cancelled {
			// Kill the process and keep reading for its exit.
			cancelled = true
			p.c.sendBounded(proto.Frame{Kind: proto.KindCancel, ID: p.s.id})
			ctx = context.WithoutCancel(ctx)
			continue
		}
		if err != nil {
			p.err = err
			p.stdout.close(err)
			p.stderr.close(err)
			return
		}
		switch f.Kind {
		case proto.KindStdout:
			p.stdout.write(f.Payload)
		case proto.KindStderr:
			p.stderr.write(f.Payload)
		case proto.KindAck:
			select {
			case <-p.window:
			default: // an ack the client never asked for
			}
		case proto.KindExit:
			p.err = proto.Decode(f, &p.exit)
			// What killed a command from outside is the daemon's to say,
			// never the sandbox's (proto.Exit.KilledBy).
			p.exit.KilledBy, p.exit.KilledReason = "", ""
			p.stdout.close(io.EOF)
			p.stderr.close(io.EOF)
			return
		}
	}
}

// Wait waits for the process to exit and returns how it ended.
func (p *Process) Wait(ctx context.Context) (proto.Exit, error) {
	select {
	case <-p.done:
		return p.exit, p.err
	case <-ctx.Done():
		return proto.Exit{}, ctx.Err()
	}
}

// Outcome returns a Process like p (the same output, input, signals and
// resizes) whose Wait reports what f makes of p's exit and error: f runs
// once, in a goroutine of its own, when p has ended.
func (p *Process) Outcome(f func(proto.Exit, error) (proto.Exit, error)) *Process {
	q := &Process{PID: p.PID, Stdout: p.Stdout, Stderr: p.Stderr, Stdin: p.Stdin,
		c: p.c, s: p.s, window: p.window, stdout: p.stdout, stderr: p.stderr, done: make(chan struct{})}
	go func() {
		defer close(q.done)
		<-p.done
		q.exit, q.err = f(p.exit, p.err)
	}()
	return q
}

// Signal sends sig to the process, or to its whole process group.
func (p *Process) Signal(sig syscall.Signal, group bool) error {
	f, err := proto.JSONFrame(proto.KindSignal, p.s.id, proto.Signal{Signal: int(sig), Group: group})
	if err != nil {
		return err
	}
	return p.c.sendBounded(f)
}

// Resize changes the size of the process's terminal.
func (p *Process) Resize(rows, cols uint16) error {
	f, err := proto.JSONFrame(proto.KindResize, p.s.id, proto.Resize{Rows: rows, Cols: cols})
	if err != nil {
		return err
	}
	return p.c.sendBounded(f)
}

// stdin writes to the process in chunks, at most proto.StdinWindow of
// them unacknowledged.
type stdin struct{ p *Process }

func (w stdin) Write(b []byte) (int, error) {
	p := w.p
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	n := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), proto.ChunkSize)]
		select {
		case p.window <- struct{}{}:
		case <-p.done:
			return n, errors.New("write to the stdin of an exited process")
		}
		if err := p.c.sendBounded(proto.Frame{Kind: proto.KindStdin, ID: p.s.id, Payload: chunk}); err != nil {
			return n, err
		}
		n += len(chunk)
		b = b[len(chunk):]
	}
	return n, nil
}

func (w stdin) Close() error {
	return w.p.c.sendBounded(proto.Frame{Kind: proto.KindCloseStdin, ID: w.p.s.id})
}

// pipe is a bounded buffer between the connection's reader and a caller.
type pipe struct {
	mu   sync.Mutex
	cond *sync.Cond
	buf  []byte
	err  error // returned once buf is empty
}

func newPipe() *pipe {
	p := &pipe{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// write appends b, waiting while the buffer is full.
func (p *pipe) write(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.buf) >= outputBuffer && p.err == nil {
		p.cond.Wait()
	}
	p.buf = append(p.buf, b...)
	p.cond.Broadcast()
}

func (p *pipe) close(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
	p.cond.Broadcast()
}

func (p *pipe) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.buf) == 0 && p.err == nil {
		p.cond.Wait()
	}
	if len(p.buf) == 0 {
		return 0, p.err
	}
	n := copy(b, p.buf)
	p.buf = p.buf[n:]
	if len(p.buf) == 0 {
		p.buf = nil
	}
	p.cond.Broadcast()
	return n, nil
}
