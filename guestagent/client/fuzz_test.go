package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"tine/guestagent/proto"
)

// hostile is an agent that answers the client's hello, waits until the
// client has sent a frame of kind until (its request, or a put's end),
// then sends answer and hangs up; or, with a non-nil answered, calls it
// and stays silent until closed. What the client sends is discarded.
type hostile struct {
	hello     []byte
	answer    io.Reader
	until     proto.Kind
	answered  func()
	asked     chan struct{}
	closed    chan struct{}
	askOnce   sync.Once
	closeOnce sync.Once
}

func newHostile(answer []byte, until proto.Kind, answered func()) *hostile {
	hello, _ := proto.AppendFrame(nil, proto.HelloFrame())
	return &hostile{hello: hello, answer: bytes.NewReader(answer), until: until, answered: answered,
		asked: make(chan struct{}), closed: make(chan struct{})}
}

func (h *hostile) Read(b []byte) (int, error) {
	if len(h.hello) > 0 {
		n := copy(b, h.hello)
		h.hello = h.hello[n:]
		return n, nil
	}
	select {
	case <-h.asked:
	case <-h.closed:
		return 0, net.ErrClosed
	}
	select {
	case <-h.closed:
		return 0, net.ErrClosed
	default:
	}
	n, err := h.answer.Read(b)
	if err == io.EOF && h.answered != nil {
		h.answered()
		<-h.closed
		return 0, net.ErrClosed
	}
	return n, err
}

// Write sees one frame per call (proto.WriteFrame).
func (h *hostile) Write(b []byte) (int, error) {
	if len(b) >= proto.HeaderLen && proto.Kind(b[4]) == h.until {
		h.askOnce.Do(func() { close(h.asked) })
	}
	return len(b), nil
}

func (h *hostile) Close() error {
	h.closeOnce.Do(func() { close(h.closed) })
	return nil
}

// answerOf is what a client reads of b for its first request (id 1): its
// frames, up to the first frame that ends the connection (an invalid one,
// or an error for the whole connection).
func answerOf(b []byte) []proto.Frame {
	r := bytes.NewReader(b)
	var fs []proto.Frame
	for {
		f, err := proto.ReadFrame(r)
		if err != nil || f.ID == 0 && f.Kind == proto.KindError {
			return fs
		}
		if f.ID == 1 {
			fs = append(fs, f)
		}
	}
}

// agentErrorFrame reports whether f is an Error frame the client can decode.
func agentErrorFrame(f proto.Frame) bool {
	var e proto.Error
	return f.Kind == proto.KindError && proto.Decode(f, &e) == nil
}

// fuzzCall is one call given a fuzzed answer.
type fuzzCall struct {
	t   *testing.T
	op  string
	ctx context.Context
	c   *Client
	// ans is what the client reads for the call (answerOf).
	ans []proto.Frame
	// silent: the agent does not hang up after its answer; ctx is
	// cancelled once the client has read it.
	silent bool
}

// check holds for every call: with no answer it fails (closed, or
// cancelled when the agent stays silent); with an Error first it returns
// an AgentError, unless cancelled first; and it succeeds only if ok holds
// for the answer's first frame.
func (fc *fuzzCall) check(err error, ok func(proto.Frame) bool) {
	fc.t.Helper()
	cancelled := fc.silent && errors.Is(err, context.Canceled)
	switch {
	case len(fc.ans) == 0:
		if !errors.Is(err, ErrClosed) && !cancelled {
			fc.t.Errorf("%s: no answer, yet %v", fc.op, err)
		}
	case agentErrorFrame(fc.ans[0]):
		if ae := (*AgentError)(nil); !errors.As(err, &ae) && !cancelled {
			fc.t.Errorf("%s: the agent answered an error, yet %v", fc.op, err)
		}
	case err == nil && !ok(fc.ans[0]):
		fc.t.Errorf("%s: succeeded on an answer starting with %v", fc.op, fc.ans[0].Kind)
	}
}

func isEnd(f proto.Frame) bool { return f.Kind == proto.KindEnd }

// checkEvent fails on an event no agent may have the client pass on.
func checkEvent(t *testing.T, e proto.Event) {
	t.Helper()
	ok := false
	switch e.Type {
	case proto.EventProcessStarted:
		ok = e.Process != nil && e.Exit == nil && e.Port == nil && e.Lost == 0
	case proto.EventProcessExited:
		ok = e.Process != nil && e.Port == nil && e.Lost == 0 && (e.Exit == nil || e.Exit.KilledBy == "" && e.Exit.KilledReason == "")
	case proto.EventPortOpened, proto.EventPortClosed:
		ok = e.Port != nil && e.Process == nil && e.Exit == nil && e.Lost == 0
	case proto.EventLost:
		ok = e.Lost > 0 && e.Lost <= maxLost && e.Process == nil && e.Exit == nil && e.Port == nil
	}
	if !ok {
		t.Errorf("events: passed on %+v", e)
	}
}

// acceptable reports whether the client may pass on the event f carries.
func acceptable(f proto.Frame) bool {
	var e proto.Event
	if f.Kind != proto.KindEvent || len(f.Payload) > proto.MaxItemBytes || proto.Decode(f, &e) != nil {
		return false
	}
	switch e.Type {
	case proto.EventProcessStarted, proto.EventProcessExited:
		return e.Process != nil
	case proto.EventPortOpened, proto.EventPortClosed:
		return e.Port != nil
	case proto.EventLost:
		return e.Lost > 0 && e.Lost < maxLost
	}
	return false
}

// fuzzOp is one call a fuzzed answer is given to.
type fuzzOp struct {
	name string
	// until is the client's frame after which the agent answers.
	until proto.Kind
	// silentToo runs the call a second time with an agent that stays
	// silent after its answer.
	silentToo bool
	run       func(fc *fuzzCall)
}

// putSource spans two chunks, so that a put polls for an early refusal.
var putSource = bytes.Repeat([]byte("p"), proto.ChunkSize+1)

var fuzzOps = []fuzzOp{
	{"ps", proto.KindPs, false, func(fc *fuzzCall) {
		_, err := fc.c.Ps(fc.ctx)
		fc.check(err, func(proto.Frame) bool { return true })
	}},
	{"ports", proto.KindPorts, false, func(fc *fuzzCall) {
		_, err := fc.c.Ports(fc.ctx)
		fc.check(err, func(proto.Frame) bool { return true })
	}},
	{"get", proto.KindGet, false, func(fc *fuzzCall) {
		_, err := fc.c.GetFile(fc.ctx, "f", io.Discard)
		fc.check(err, func(f proto.Frame) bool { return f.Kind == proto.KindFileInfo })
	}},
	{"exec", proto.KindExec, false, func(fc *fuzzCall) {
		p, err := fc.c.Exec(fc.ctx, proto.ExecRequest{Argv: []string{"x"}})
		fc.check(err, func(f proto.Frame) bool { return f.Kind == proto.KindStarted })
		if err == nil {
			go io.Copy(io.Discard, p.Stderr)
			io.Copy(io.Discard, p.Stdout)
			p.Wait(fc.ctx)
		}
		// An error's code is one this side knows, or none.
		if ae := (*AgentError)(nil); errors.As(err, &ae) && ae.Code != "" && ae.ExitStatus() == 0 {
			fc.t.Errorf("exec: an unknown code passed: %q", ae.Code)
		}
	}},
	{"hygiene", proto.KindHygiene, true, func(fc *fuzzCall) {
		err := fc.c.Hygiene(fc.ctx, proto.HygieneRequest{Generation: 2, Entropy: []byte("e")})
		fc.check(err, isEnd)
		if !fc.silent && err != nil && len(fc.ans) > 0 && isEnd(fc.ans[0]) {
			fc.t.Errorf("hygiene: %v on an answer of end", err)
		}
	}},
	// The agent answers a put once it has the whole file...
	{"put", proto.KindEnd, true, func(fc *fuzzCall) {
		err := fc.c.PutFile(fc.ctx, "f", 0o644, bytes.NewReader(putSource))
		fc.check(err, isEnd)
		if !fc.silent && err != nil && len(fc.ans) > 0 && isEnd(fc.ans[0]) {
			fc.t.Errorf("put: %v on an answer of end", err)
		}
	}},
	// ...or, to refuse it, while it is still sent.
	{"put-early", proto.KindPut, true, func(fc *fuzzCall) {
		err := fc.c.PutFile(fc.ctx, "f", 0o644, bytes.NewReader(putSource))
		fc.check(err, isEnd)
	}},
	// A tree: put-tree's end carries where the copy landed...
	{"put-tree", proto.KindEnd, true, func(fc *fuzzCall) {
		dest, err := fc.c.PutTree(fc.ctx, "d", false, bytes.NewReader(putSource))
		fc.check(err, isEnd)
		if err == nil && (len(fc.ans) == 0 || proto.Decode(fc.ans[0], new(proto.PutTreeResult)) != nil) {
			fc.t.Errorf("put-tree: %q without an end that decodes", dest)
		}
	}},
	{"put-tree-early", proto.KindPutTree, true, func(fc *fuzzCall) {
		_, err := fc.c.PutTree(fc.ctx, "d", true, bytes.NewReader(putSource))
		fc.check(err, isEnd)
	}},
	// ...and get-tree gives data only until an end.
	{"get-tree", proto.KindGetTree, true, func(fc *fuzzCall) {
		var got bytes.Buffer
		err := fc.c.GetTree(fc.ctx, "d", &got)
		fc.check(err, func(f proto.Frame) bool { return f.Kind == proto.KindData || isEnd(f) })
		if err == nil {
			want := 0
			for _, f := range fc.ans {
				if isEnd(f) {
					break
				}
				want += len(f.Payload)
			}
			if got.Len() != want {
				fc.t.Errorf("get-tree: wrote %d bytes, the data before the end held %d", got.Len(), want)
			}
		}
	}},
	// A caller that reads events as they come.
	{"events", proto.KindEvents, true, func(fc *fuzzCall) {
		ch, err := fc.c.Events(fc.ctx)
		if err != nil {
			fc.t.Errorf("events: %v", err)
			return
		}
		sent := 0
		for _, f := range fc.ans {
			if acceptable(f) {
				sent++
			}
		}
		n := 0
		for e := range ch {
			checkEvent(fc.t, e)
			// Each event is passed on or dropped, and a "lost" event the
			// client makes stands for one dropped, or more.
			if n++; n > sent {
				fc.t.Errorf("events: %d events of the %d the agent may send", n, sent)
				return
			}
		}
	}},
	// A caller that reads none until the connection has ended: no event
	// is dropped before eventQueue wait, so the first eventQueue queued
	// are the first the agent may send, in order.
	{"events-slow", proto.KindEvents, false, func(fc *fuzzCall) {
		ch, err := fc.c.Events(fc.ctx)
		if err != nil {
			fc.t.Errorf("events-slow: %v", err)
			return
		}
		var want []proto.Event
		for _, f := range fc.ans {
			if f.Kind == proto.KindEnd || f.Kind == proto.KindError {
				break
			}
			if acceptable(f) {
				var e proto.Event
				proto.Decode(f, &e)
				want = append(want, e)
			}
		}
		select {
		case <-fc.c.Done():
		case <-fc.ctx.Done():
			return
		}
		n := 0
		for e := range ch {
			checkEvent(fc.t, e)
			if n < min(len(want), eventQueue) && (e.Type != want[n].Type || e.Lost != want[n].Lost && e.Type == proto.EventLost) {
				fc.t.Errorf("events-slow: event %d is %+v, the agent sent %+v", n, e, want[n])
			}
			n++
		}
		// A "lost" event the client makes stands for one dropped, or more.
		if n < min(len(want), eventQueue) || n > len(want) {
			fc.t.Errorf("events-slow: %d events of the %d the agent may send", n, len(want))
		}
	}},
}

const (
	// fuzzCallTimeout bounds one call; the agent hangs up after its
	// answer, so a call that needs its deadline to return hangs.
	fuzzCallTimeout = 10 * time.Second
	// fuzzAllocBase and fuzzAllocPerByte bound what one input may make
	// the client allocate over all of fuzzOps: a frame's payload is
	// allocated only once its header is checked (at most MaxPayload), and
	// the rest is in proportion to what the agent sent.
	fuzzAllocBase    = 32 << 20
	fuzzAllocPerByte = 256
)

// runOp gives b to op on a new client and fails if the call, or closing
// the client after it, does not return.
func runOp(t *testing.T, op fuzzOp, b []byte, ans []proto.Frame, silent bool) {
	name := op.name
	if silent {
		name += " (silent agent)"
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), fuzzCallTimeout)
		defer cancel()
		var answered func()
		if silent {
			answered = cancel
		}
		c, err := New(newHostile(b, op.until, answered))
		if err != nil {
			t.Errorf("%s: handshake: %v", name, err)
			return
		}
		op.run(&fuzzCall{t: t, op: name, ctx: ctx, c: c, ans: ans, silent: silent})
		if ctx.Err() == context.DeadlineExceeded {
			t.Errorf("%s: the call returned only at its deadline", name)
		}
		c.Close()
	}()
	select {
	case <-done:
	case <-time.After(fuzzCallTimeout + 5*time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s: the call or Close does not return:\n%s", name, buf[:runtime.Stack(buf, true)])
	}
}

// FuzzClient plays an agent that answers each call of fuzzOps (Ps, Ports,
// GetFile, Exec, Hygiene, PutFile, Events) with the fuzzed bytes, then
// hangs up, or for some calls stays silent while the caller cancels:
// every call returns (never at its deadline), never panics, allocates in
// proportion to what the agent sent, fails on an answer that is not the
// protocol's, and Events passes on no more events than the agent sent and
// none that an agent may not send.
func FuzzClient(f *testing.F) {
	end := proto.Frame{Kind: proto.KindEnd, ID: 1}
	proc := &proto.Process{PID: 7, PPID: 1, Argv: []string{"sleep", "1"}, Comm: "sleep", State: "S"}
	ev := func(e proto.Event) proto.Frame { return jf(proto.KindEvent, 1, e) }
	now := time.Unix(1700000000, 0).UTC()
	events := []proto.Frame{
		ev(proto.Event{Type: proto.EventProcessStarted, Time: now, Process: proc}),
		ev(proto.Event{Type: proto.EventProcessExited, Time: now, Process: proc, Exit: &proto.Exit{PID: 7, Code: -1, Signal: 9}}),
		ev(proto.Event{Type: proto.EventPortOpened, Time: now, Port: &proto.Port{Proto: "tcp", Address: "0.0.0.0", Port: 80, PID: 7}}),
		ev(proto.Event{Type: proto.EventPortClosed, Time: now, Port: &proto.Port{Proto: "udp6", Address: "::", Port: 53}}),
		ev(proto.Event{Type: proto.EventLost, Time: now, Lost: 12}),
	}
	many := make([]proto.Frame, 0, eventQueue+50)
	for i := range eventQueue + 50 {
		many = append(many, ev(proto.Event{Type: proto.EventLost, Lost: 1 + i%3}))
	}
	hostileEvents := []proto.Frame{
		ev(proto.Event{Type: "oom-kill", Time: now}),
		ev(proto.Event{Type: proto.EventProcessStarted}),
		ev(proto.Event{Type: proto.EventPortOpened, Process: proc}),
		ev(proto.Event{Type: proto.EventLost, Lost: -3}),
		ev(proto.Event{Type: proto.EventLost, Lost: 1<<31 - 1}),
		ev(proto.Event{Type: proto.EventProcessExited, Process: proc, Exit: &proto.Exit{PID: 7, KilledBy: proto.KilledOOM, KilledReason: "out of memory"}}),
		ev(proto.Event{Type: proto.EventPortClosed, Port: &proto.Port{Port: 1}, Lost: 5}),
		{Kind: proto.KindEvent, ID: 1, Payload: []byte(`{"type":"port-opened","port":`)},
		{Kind: proto.KindEvent, ID: 1, Payload: append(append([]byte(`{"type":"lost","lost":1,"x":"`), bytes.Repeat([]byte("x"), proto.MaxItemBytes)...), `"}`...)},
		jf(proto.KindItem, 1, proto.Process{PID: 1}),
	}
	seeds := [][]proto.Frame{
		// Answers of Ps, Exec, GetFile.
		{jf(proto.KindItem, 1, proto.Process{PID: 1, Argv: []string{"a"}}), end},
		{jf(proto.KindStarted, 1, proto.Started{PID: 3}), {Kind: proto.KindStdout, ID: 1, Payload: []byte("x")}, jf(proto.KindExit, 1, proto.Exit{Code: 1})},
		{jf(proto.KindFileInfo, 1, proto.FileInfo{Size: 1}), {Kind: proto.KindData, ID: 1, Payload: []byte("x")}, end},
		{jf(proto.KindError, 1, proto.Error{Message: "x: command not found", Code: proto.CodeNotFound})},
		{jf(proto.KindError, 1, proto.Error{Message: "x", Code: "made-up"})},
		// Answers of PutFile and Hygiene: an end, a refusal, or an end
		// after what they are never answered.
		{end},
		{jf(proto.KindError, 1, proto.Error{Message: "put f: permission denied"})},
		{{Kind: proto.KindError, ID: 1, Payload: []byte(`{"message":`)}},
		{{Kind: proto.KindData, ID: 1, Payload: []byte("x")}, end},
		// Answers of PutTree and GetTree.
		{jf(proto.KindEnd, 1, proto.PutTreeResult{Path: "/d"})},
		{{Kind: proto.KindData, ID: 1, Payload: []byte("x")}, {Kind: proto.KindData, ID: 1, Payload: []byte("y")}, jf(proto.KindError, 1, proto.Error{Message: "read: input/output error"})},
		{jf(proto.KindItem, 1, proto.Port{Port: 1}), end},
		{{Kind: proto.KindEnd, ID: 2}, end},
		{jf(proto.KindError, 0, proto.Error{Message: "going away"}), end},
		// Answers of Events.
		append(append([]proto.Frame{}, events...), end),
		append(append([]proto.Frame{}, hostileEvents...), events...),
		append(many, events...),
	}
	for _, s := range seeds {
		b := frames(f, s...)
		f.Add(b)
		// Truncated: inside the last frame, and inside its header.
		f.Add(b[:len(b)-1])
		last, _ := proto.AppendFrame(nil, s[len(s)-1])
		f.Add(b[:len(b)-len(last)+proto.HeaderLen-1])
		// Oversized: a frame over MaxPayload, and one at it that ends early.
		head := b[:len(b)-len(last)]
		f.Add(append(bytes.Clone(head), bigHeader(s[len(s)-1].Kind, proto.MaxPayload+1)...))
		f.Add(append(bytes.Clone(head), bigHeader(s[len(s)-1].Kind, proto.MaxPayload)...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ans := answerOf(b)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, op := range fuzzOps {
			runOp(t, op, b, ans, false)
			if op.silentToo {
				runOp(t, op, b, ans, true)
			}
		}
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > fuzzAllocBase+fuzzAllocPerByte*uint64(len(b)) {
			t.Errorf("%d bytes allocated for an answer of %d bytes", n, len(b))
		}
	})
}

// bigHeader is the header of a frame of n bytes for request 1 (whatever
// n, unlike proto.AppendFrame).
func bigHeader(k proto.Kind, n uint32) []byte {
	h := binary.BigEndian.AppendUint32(nil, n)
	h = append(h, byte(k))
	return binary.BigEndian.AppendUint32(h, 1)
}

// TestEventsAgentMayNotSend: the client passes on only the events an
// agent sends, without what only the daemon may say.
func TestEventsAgentMayNotSend(t *testing.T) {
	proc := &proto.Process{PID: 7}
	b := frames(t,
		jf(proto.KindEvent, 1, proto.Event{Type: "oom-kill"}),
		jf(proto.KindEvent, 1, proto.Event{Type: proto.EventLost, Lost: -3}),
		jf(proto.KindEvent, 1, proto.Event{Type: proto.EventPortOpened}),
		jf(proto.KindEvent, 1, proto.Event{Type: proto.EventProcessExited, Process: proc, Port: &proto.Port{Port: 1},
			Exit: &proto.Exit{PID: 7, Code: -1, Signal: 9, KilledBy: proto.KilledOOM, KilledReason: "out of memory"}}),
		jf(proto.KindEvent, 1, proto.Event{Type: proto.EventLost, Lost: 2}),
		proto.Frame{Kind: proto.KindEnd, ID: 1})
	c, err := New(newHostile(b, proto.KindEvents, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []proto.Event
	for e := range ch {
		got = append(got, e)
	}
	if len(got) != 2 || got[0].Type != proto.EventProcessExited || got[0].Port != nil || got[0].Exit.Signal != 9 ||
		got[0].Exit.KilledBy != "" || got[0].Exit.KilledReason != "" || got[1].Type != proto.EventLost || got[1].Lost != 2 {
		t.Fatalf("events %+v, want the exit without killed_by or a port, then 2 lost", got)
	}
}

// TestPutFileAnswer: a put succeeds only on the agent's End; any other
// answer is an error, not a success.
func TestPutFileAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, until := range []proto.Kind{proto.KindPut, proto.KindEnd} {
		for _, ans := range [][]proto.Frame{
			{jf(proto.KindItem, 1, proto.Process{PID: 1}), {Kind: proto.KindEnd, ID: 1}},
			{{Kind: proto.KindData, ID: 1, Payload: []byte("x")}},
		} {
			c, err := New(newHostile(frames(t, ans...), until, nil))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.PutFile(ctx, "f", 0o644, bytes.NewReader(putSource)); err == nil {
				t.Errorf("put answered by %v (after %v) succeeded", ans[0].Kind, until)
			}
			c.Close()
		}
	}
}
