package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// timeoutGrace is how long after an exec's Timeout the server kills the
// command itself, should the guest agent not have.
const timeoutGrace = 5 * time.Second

// exitWait bounds the wait for a killed command's exit report.
const exitWait = 10 * time.Second

// outputChunk is the most output bytes one ExecEvent carries.
const outputChunk = 32 << 10

// startExec validates req and starts it in the sandbox the path names;
// the returned context ends when the command must die: the caller's end,
// the server's close, or the timeout and its grace.
func (s *Server) startExec(ctx context.Context, name string, req ExecRequest) (*client.Process, context.Context, context.CancelFunc, error) {
	if err := req.validate(); err != nil {
		return nil, nil, nil, err
	}
	if _, err := s.m.Get(name); err != nil {
		return nil, nil, nil, err
	}
	pr := req.ExecRequest
	pr.Timeout = req.Timeout
	cancel := context.CancelFunc(func() {})
	if req.Timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, req.Timeout+timeoutGrace)
	}
	p, err := s.m.Exec(ctx, name, pr)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return p, ctx, cancel, nil
}

// pump sends a process's output and then its exit as events. When send
// fails (the client left) it calls kill and keeps draining the output, so
// that the guest agent's connection, shared by every exec of the
// sandbox, never stalls on it.
func pump(ctx context.Context, p *client.Process, kill func(), send func(ExecEvent) error) {
	var mu sync.Mutex
	failed := false
	emit := func(ev ExecEvent) {
		mu.Lock()
		defer mu.Unlock()
		if failed {
			return
		}
		if send(ev) != nil {
			failed = true
			kill()
		}
	}
	var wg sync.WaitGroup
	copyOut := func(r io.Reader, stderr bool) {
		defer wg.Done()
		buf := make([]byte, outputChunk)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				b := append([]byte(nil), buf[:n]...)
				if stderr {
					emit(ExecEvent{Stderr: b})
				} else {
					emit(ExecEvent{Stdout: b})
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go copyOut(p.Stdout, false)
	go copyOut(p.Stderr, true)
	wg.Wait()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), exitWait)
	defer cancel()
	ex, err := p.Wait(wctx)
	if err != nil {
		emit(ExecEvent{Error: &Error{Code: "internal", Message: fmt.Sprintf("exec: %v", err)}})
		return
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		ex.TimedOut = true
	}
	emit(ExecEvent{Exit: &ex})
}

// exec answers POST /v1/sandboxes/{name}/exec with an NDJSON stream of
// ExecEvents, each flushed as it is written.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(w, r)
	if !ok {
		return
	}
	var req ExecRequest
	if !decode(w, r, &req) {
		return
	}
	rctx, rcancel := s.context(r)
	defer rcancel()
	p, ctx, cancel, err := s.startExec(rctx, name, req)
	if err != nil {
		writeError(w, err)
		return
	}
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(ev ExecEvent) error {
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	}
	if send(ExecEvent{Started: &proto.Started{PID: p.PID}}) != nil {
		rcancel()
	}
	pump(ctx, p, rcancel, send)
}

// wsReadTimeout bounds the wait for an interactive exec's first message.
const wsReadTimeout = 30 * time.Second

// execWS answers GET /v1/sandboxes/{name}/exec/ws: a WebSocket whose
// first text message is an ExecRequest; then ExecInput messages go to the
// command and ExecEvent messages come back. The connection's end kills
// the command.
func (s *Server) execWS(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(w, r)
	if !ok {
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept has answered
	}
	conn.SetReadLimit(MaxRequestBytes)
	defer conn.CloseNow()
	ctx, cancel := s.context(r)
	defer cancel()
	var wmu sync.Mutex
	send := func(ev ExecEvent) error {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		wmu.Lock()
		defer wmu.Unlock()
		return conn.Write(ctx, websocket.MessageText, b)
	}
	fail := func(err error) {
		_, e := statusOf(err)
		send(ExecEvent{Error: e})
		conn.Close(websocket.StatusPolicyViolation, truncate(e.Message, 120))
	}
	first, cancelFirst := context.WithTimeout(ctx, wsReadTimeout)
	_, msg, err := conn.Read(first)
	cancelFirst()
	if err != nil {
		return
	}
	var req ExecRequest
	if err := decodeJSON(msg, &req); err != nil {
		fail(err)
		return
	}
	p, pctx, pcancel, err := s.startExec(ctx, name, req)
	if err != nil {
		fail(err)
		return
	}
	defer pcancel()
	if send(ExecEvent{Started: &proto.Started{PID: p.PID}}) != nil {
		cancel()
	}
	go func() {
		// Input until the connection ends; a bad message ends it.
		for {
			_, msg, err := conn.Read(ctx)
			if err != nil {
				cancel()
				return
			}
			if err := applyInput(p, msg); err != nil {
				fail(err)
				cancel()
				return
			}
		}
	}()
	pump(pctx, p, cancel, send)
	conn.Close(websocket.StatusNormalClosure, "")
}

// decodeInput decodes and checks one ExecInput message.
func decodeInput(msg []byte) (ExecInput, error) {
	var in ExecInput
	if b, ok := BytesField(msg, "stdin"); ok {
		in.Stdin = b
		return in, nil
	}
	if err := decodeJSON(msg, &in); err != nil {
		return in, err
	}
	return in, in.validate()
}

// applyInput hands one ExecInput message to the process.
func applyInput(p *client.Process, msg []byte) error {
	in, err := decodeInput(msg)
	if err != nil {
		return err
	}
	// Writes to a process that has exited fail; its exit event follows.
	if len(in.Stdin) > 0 {
		p.Stdin.Write(in.Stdin)
	}
	if in.CloseStdin {
		p.Stdin.Close()
	}
	if in.Resize != nil {
		p.Resize(in.Resize.Rows, in.Resize.Cols)
	}
	if in.Signal != nil {
		p.Signal(syscall.Signal(in.Signal.Signal), in.Signal.Group)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// logs answers GET /v1/sandboxes/{name}/logs?follow=1&tail=N with the
// services' output as text, flushed as it comes.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	o, err := logOptions(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := s.context(r)
	defer cancel()
	rc, err := s.m.Logs(ctx, name, o)
	if err != nil {
		writeError(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	flushCopy(w, rc)
}

// flushCopy copies r to w, flushing after each read.
func flushCopy(w http.ResponseWriter, r io.Reader) {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil || rc.Flush() != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// events answers GET /v1/sandboxes/{name}/events with an NDJSON stream of
// the guest agent's events, and the host's (oom-kill, frozen, thawed,
// approval-asked), until the client leaves or the sandbox stops.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	// A frozen sandbox's stream opens too: its agent's events come once
	// it is thawed, the host's (thawed among them) at once.
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	c, ok := s.agentOf(w, r, name)
	if !ok {
		return
	}
	ctx, cancel := s.context(r)
	defer cancel()
	ch, err := c.Events(ctx)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	enc := json.NewEncoder(w)
	// The host's events about the sandbox (OOM kills, freezes: see
	// sandbox/limits_watch.go) go out beside the agent's.
	host := s.m.HostEvents(ctx, r.PathValue("name"))
	for ch != nil {
		var ev proto.Event
		var ok bool
		select {
		case ev, ok = <-ch:
			if !ok {
				ch = nil
				continue
			}
		case ev, ok = <-host:
			if !ok {
				host = nil
				continue
			}
		}
		if enc.Encode(ev) != nil || rc.Flush() != nil {
			cancel()
		}
	}
}

// logOptions reads ?follow=1&tail=N.
func logOptions(r *http.Request) (sandbox.LogOptions, error) {
	q := r.URL.Query()
	var o sandbox.LogOptions
	switch q.Get("follow") {
	case "", "0", "false":
	case "1", "true":
		o.Follow = true
	default:
		return o, badRequest("parameter \"follow\" %q: want 1 or 0", q.Get("follow"))
	}
	if t := q.Get("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 {
			return o, badRequest("parameter \"tail\" %q: want a number of lines, 0 or more", t)
		}
		o.Tail = n
	}
	return o, nil
}
