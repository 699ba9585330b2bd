package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tine/guestagent/proto"
)

// scripted is an agent that sends fixed bytes and ignores what it gets.
type scripted struct{ r io.Reader }

func (s scripted) Read(b []byte) (int, error)  { return s.r.Read(b) }
func (s scripted) Write(b []byte) (int, error) { return len(b), nil }
func (s scripted) Close() error                { return nil }

// answering is an agent that answers the client's hello, then sends
// answer once the client's first request arrives (the way a real agent
// orders them), then hangs up.
func answering(t testing.TB, answer ...proto.Frame) net.Conn {
	host, agent := net.Pipe()
	hello, b := frames(t, proto.HelloFrame()), frames(t, answer...)
	go func() {
		defer agent.Close()
		for {
			f, err := proto.ReadFrame(agent)
			if err != nil {
				return
			}
			if f.Kind == proto.KindHello {
				if _, err := agent.Write(hello); err != nil {
					return
				}
				continue
			}
			agent.Write(b)
			return
		}
	}()
	return host
}

func frames(t testing.TB, fs ...proto.Frame) []byte {
	var b []byte
	for _, f := range fs {
		var err error
		if b, err = proto.AppendFrame(b, f); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func jf(k proto.Kind, id uint32, v any) proto.Frame {
	f, _ := proto.JSONFrame(k, id, v)
	return f
}

func TestHandshakeRefusesOtherVersion(t *testing.T) {
	b := frames(t, jf(proto.KindHello, 0, proto.Hello{Magic: proto.Magic, Version: proto.Version + 1}))
	if _, err := New(scripted{bytes.NewReader(b)}); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("agent of version 2: %v", err)
	}
	if _, err := New(scripted{strings.NewReader("SSH-2.0-OpenSSH\r\n")}); err == nil {
		t.Fatal("a non-agent peer passed the handshake")
	}
}

// TestHostileAgentAnswers: answers that break the protocol's bounds or
// order are errors on the host, never more memory or a hang.
func TestHostileAgentAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	big := make([]byte, proto.MaxItemBytes+1)
	c, err := New(answering(t, proto.Frame{Kind: proto.KindItem, ID: 1, Payload: big}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ps(ctx); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("oversize item: %v", err)
	}
	c, _ = New(answering(t, jf(proto.KindFileInfo, 1, proto.FileInfo{Size: 2}),
		proto.Frame{Kind: proto.KindData, ID: 1, Payload: []byte("abc")}))
	var out bytes.Buffer
	if _, err := c.GetFile(ctx, "f", &out); err == nil || out.Len() != 0 {
		t.Fatalf("more data than announced: %v, %q written", err, out.String())
	}
	// A connection that ends mid-answer ends the call.
	c, _ = New(answering(t, jf(proto.KindItem, 1, proto.Process{PID: 1})))
	if _, err := c.Ps(ctx); err == nil {
		t.Fatal("ps over a dropped connection succeeded")
	}
}

// TestExecErrorCode: an exec that did not start comes back as an
// AgentError with the agent's code and the exit status it means; a code
// the client does not know is none.
func TestExecErrorCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tc := range []struct {
		code, want string
		status     int
	}{
		{proto.CodeNotFound, proto.CodeNotFound, 127},
		{proto.CodeNotExecutable, proto.CodeNotExecutable, 126},
		{proto.CodeBadDir, proto.CodeBadDir, 126},
		{"", "", 0},
		{"made-up", "", 0},
	} {
		c, err := New(answering(t, jf(proto.KindError, 1, proto.Error{Message: "x: failed", Code: tc.code})))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Exec(ctx, proto.ExecRequest{Argv: []string{"x"}})
		ae := (*AgentError)(nil)
		if !errors.As(err, &ae) || ae.Code != tc.want || ae.ExitStatus() != tc.status || ae.Message != "x: failed" {
			t.Errorf("code %q: %#v (%v), want code %q and status %d", tc.code, ae, err, tc.want, tc.status)
		}
		c.Close()
	}
}

// TestExitKilledByIsNotTheAgents: an agent (which a sandbox's root can
// take over) cannot say what killed a command: the client drops
// killed_by and killed_reason from its exit, for the daemon to set.
func TestExitKilledByIsNotTheAgents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := New(answering(t, jf(proto.KindStarted, 1, proto.Started{PID: 3}),
		jf(proto.KindExit, 1, proto.Exit{PID: 3, Code: -1, Signal: 9, KilledBy: proto.KilledRemoved, KilledReason: "the sandbox was removed"})))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := p.Wait(ctx)
	if err != nil || ex.Signal != 9 || ex.KilledBy != "" || ex.KilledReason != "" {
		t.Fatalf("exit the agent said was a removal: %+v, %v; want signal 9 and no killed_by", ex, err)
	}
}

// deafAgent is a client of an agent that answers the hello, then never
// reads again, over a pipe with no buffer: every write waits for a read.
func deafAgent(t *testing.T) *Client {
	host, agent := net.Pipe()
	go func() {
		if f, err := proto.ReadFrame(agent); err == nil && f.Kind == proto.KindHello {
			agent.Write(frames(t, proto.HelloFrame()))
		}
	}()
	c, err := New(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); agent.Close() })
	return c
}

// An agent that stops reading (a sandbox's root can take it over) holds
// an upload only as long as the caller's context: the upload then fails,
// and so does, at its own deadline, a call that waits to send behind it;
// the connection, its stream cut short, is closed. With no deadline of the
// caller's, writeTimeout bounds each frame.
func TestAgentThatStopsReading(t *testing.T) {
	t.Run("no deadline", func(t *testing.T) {
		old := writeTimeout
		writeTimeout = 200 * time.Millisecond
		defer func() { writeTimeout = old }()
		c := deafAgent(t)
		t0 := time.Now()
		if err := c.PutFile(context.Background(), "/f", 0o644, bytes.NewReader(make([]byte, 4<<20))); !errors.Is(err, ErrClosed) {
			t.Fatalf("upload to an agent that never reads, no deadline: %v, want ErrClosed", err)
		}
		if took := time.Since(t0); took > 5*time.Second {
			t.Errorf("it took %v", took)
		}
	})
	c := deafAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	put := make(chan error, 1)
	go func() { put <- c.PutFile(ctx, "/f", 0o644, bytes.NewReader(make([]byte, 4<<20))) }()
	time.Sleep(50 * time.Millisecond)
	pctx, pcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer pcancel()
	t0 := time.Now()
	if _, err := c.Ps(pctx); err == nil {
		t.Fatal("ps behind a stuck upload succeeded")
	}
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("ps behind a stuck upload returned after %v, want its deadline", took)
	}
	select {
	case err := <-put:
		if err == nil {
			t.Fatal("an upload the agent never read succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upload outlived its context")
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the connection whose frame was cut short stays open")
	}
}

// TestDialRefusesSymlink: a symlink where the agent's socket should be
// (a sandbox that can write there could point it at any socket of the
// host) is refused, never followed; the socket itself is dialed.
func TestDialRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	sock, link := filepath.Join(dir, "host.sock"), filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			if f, err := proto.ReadFrame(c); err == nil && f.Kind == proto.KindHello {
				c.Write(frames(t, proto.HelloFrame()))
			}
			defer c.Close()
		}
	}()
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if c, err := Dial(ctx, link); err == nil || !errors.Is(err, syscall.ENOTSOCK) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial through a symlink: %v, want ENOTSOCK", err)
	}
	select {
	case <-accepted:
		t.Fatal("the socket behind the symlink was connected to")
	case <-time.After(50 * time.Millisecond):
	}
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatalf("Dial of the socket itself: %v", err)
	}
	c.Close()
}
