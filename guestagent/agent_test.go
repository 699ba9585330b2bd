package guestagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tine/guestagent/client"
	"tine/guestagent/proto"
)

// startAgent serves an agent over a real Unix socket and returns a client
// and the agent's file root.
func startAgent(t *testing.T) (*client.Client, string) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go a.Serve(l)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		l.Close()
		a.Terminate(time.Second)
		a.Close()
	})
	return c, root
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// run execs req and returns stdout, stderr and the exit.
func run(t *testing.T, c *client.Client, req proto.ExecRequest, stdin string) (string, string, proto.Exit) {
	t.Helper()
	ctx := ctxT(t)
	p, err := c.Exec(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		io.WriteString(p.Stdin, stdin)
		p.Stdin.Close()
	}()
	var out, errb bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&errb, p.Stderr); close(done) }()
	io.Copy(&out, p.Stdout)
	<-done
	x, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), x
}

func TestExecStreamsAndExitCode(t *testing.T) {
	c, _ := startAgent(t)
	out, errs, x := run(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; pwd; echo $FOO; exit 3"},
		Env: []string{"PATH=/usr/bin:/bin", "FOO=bar"}, Dir: "/tmp"}, "")
	if out != "out\n/tmp\nbar\n" || errs != "err\n" || x.Code != 3 || x.Signal != 0 {
		t.Fatalf("out %q err %q exit %+v", out, errs, x)
	}
	// Stdin larger than the acknowledgement window comes back whole.
	big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB
	out, _, x = run(t, c, proto.ExecRequest{Argv: []string{"cat"}}, big)
	if out != big || x.Code != 0 {
		t.Fatalf("cat: %d bytes back of %d, exit %+v", len(out), len(big), x)
	}
	if _, err := c.Exec(ctxT(t), proto.ExecRequest{Argv: []string{"no-such-command-here"}}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("missing command: %v", err)
	}
}

// TestExecStartFailures: a command that cannot start fails with the code
// a shell's exit status comes from (not found: 127; not executable or no
// working directory: 126) and a message naming the command or the
// directory; the connection serves the next command.
func TestExecStartFailures(t *testing.T) {
	c, _ := startAgent(t)
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := write("plain.txt", "not a program\n", 0o644)
	garbage := write("garbage", "\x7fELF, but not really", 0o755)
	noInterp := write("no-interp", "#!/no/such/interpreter\necho hi\n", 0o755)
	locked := filepath.Join(dir, "locked")
	if err := os.Mkdir(locked, 0o700); err != nil {
		t.Fatal(err)
	}
	nobody := uint32(65534)
	for _, tc := range []struct {
		argv       []string
		dir        string
		uid        *uint32
		code, want string
		status     int
	}{
		{[]string{"no-such-command-here"}, "", nil, proto.CodeNotFound, "no-such-command-here: command not found (PATH ", 127},
		{[]string{"/no/such/path", "arg"}, "", nil, proto.CodeNotFound, "/no/such/path: no such file or directory", 127},
		{[]string{"./missing"}, dir, nil, proto.CodeNotFound, "./missing: no such file or directory", 127},
		{[]string{noInterp}, "", nil, proto.CodeNotFound, noInterp + ": cannot execute: its interpreter", 127},
		{[]string{plain}, "", nil, proto.CodeNotExecutable, plain + ": permission denied", 126},
		{[]string{dir}, "", nil, proto.CodeNotExecutable, dir + ": is a directory", 126},
		{[]string{garbage}, "", nil, proto.CodeNotExecutable, garbage + ": exec format error", 126},
		{[]string{plain + "/x"}, "", nil, proto.CodeNotExecutable, plain + "/x: not a directory", 126},
		{[]string{"true"}, "/no/such/dir", nil, proto.CodeBadDir, "working directory /no/such/dir: no such file or directory", 126},
		{[]string{"true"}, plain, nil, proto.CodeBadDir, "working directory " + plain + ": not a directory", 126},
		{[]string{"no-such-command-here"}, "/no/such/dir", nil, proto.CodeBadDir, "working directory /no/such/dir", 126},
		{[]string{"true"}, locked, &nobody, proto.CodeBadDir, "working directory " + locked + ": permission denied (uid 65534", 126},
	} {
		if tc.uid != nil && os.Geteuid() != 0 {
			continue // running as another user needs root
		}
		_, err := c.Exec(ctxT(t), proto.ExecRequest{Argv: tc.argv, Dir: tc.dir, UID: tc.uid})
		ae := (*client.AgentError)(nil)
		if !errors.As(err, &ae) {
			t.Errorf("%q in %q: %v, want an agent's error", tc.argv, tc.dir, err)
			continue
		}
		if ae.Code != tc.code || ae.ExitStatus() != tc.status || !strings.Contains(ae.Message, tc.want) {
			t.Errorf("%q in %q: code %q (status %d), %q; want %q (%d) and %q", tc.argv, tc.dir, ae.Code, ae.ExitStatus(), ae.Message, tc.code, tc.status, tc.want)
		}
	}
	// The same connection runs the next command; a command that runs and
	// fails has no start error, only its exit.
	if out, _, x := run(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "echo ok; exit 127"}}, ""); out != "ok\n" || x.Code != 127 {
		t.Fatalf("after the failures: %q, exit %+v", out, x)
	}
}

// TestExecEnvDefaults: a command gets PATH and HOME when its request
// sets none of them, also when it sets other variables (git needs HOME,
// a shell PATH), and TERM on a terminal; what the request sets wins.
func TestExecEnvDefaults(t *testing.T) {
	c, _ := startAgent(t)
	show := `echo "$PATH|$HOME|$TERM|$FOO"`
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, defaultPath + "|/root||\n"},
		{[]string{"FOO=1"}, defaultPath + "|/root||1\n"},
		{[]string{"PATH=/bin", "HOME=/h"}, "/bin|/h||\n"},
	} {
		out, _, x := run(t, c, proto.ExecRequest{Argv: []string{"/bin/sh", "-c", show}, Env: tc.env}, "")
		if out != tc.want || x.Code != 0 {
			t.Errorf("env %q: %q (exit %+v), want %q", tc.env, out, x, tc.want)
		}
	}
	if got := withDefaults([]string{"A=1"}, 0, true); !slices.Contains(got, "TERM=xterm") {
		t.Errorf("on a terminal: %q, want TERM=xterm", got)
	}
}

// TestExecConcurrent: several execs stream at once over one connection.
func TestExecConcurrent(t *testing.T) {
	c, _ := startAgent(t)
	errc := make(chan error, 8)
	for i := range 8 {
		go func() {
			ctx := ctxT(t)
			p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"sh", "-c", "for i in 1 2 3 4 5; do echo $0; sleep 0.01; done", string(rune('a' + i))}})
			if err != nil {
				errc <- err
				return
			}
			b, _ := io.ReadAll(p.Stdout)
			x, err := p.Wait(ctx)
			if want := strings.Repeat(string(rune('a'+i))+"\n", 5); err == nil && (string(b) != want || x.Code != 0) {
				err = &mismatch{string(b), want}
			}
			errc <- err
		}()
	}
	for range 8 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

type mismatch struct{ got, want string }

func (m *mismatch) Error() string { return "got " + m.got + ", want " + m.want }

func TestExecTimeoutKillsGroup(t *testing.T) {
	c, _ := startAgent(t)
	start := time.Now()
	// The background sleep is in the same process group and dies too: the
	// output pipe it holds closes, so no grace period is waited for.
	_, _, x := run(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 & sleep 100"}, Timeout: 200 * time.Millisecond}, "")
	if !x.TimedOut || x.Signal != int(syscall.SIGKILL) || x.Code != -1 {
		t.Fatalf("exit %+v", x)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("timeout took %v", d)
	}
}

func TestExecSignalAndCancel(t *testing.T) {
	c, _ := startAgent(t)
	ctx := ctxT(t)
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"sh", "-c", `trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done`}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(p.Stdout, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("%q %v", buf, err)
	}
	if err := p.Signal(syscall.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(p.Stdout)
	x, err := p.Wait(ctx)
	if err != nil || x.Code != 7 || string(rest) != "got TERM\n" {
		t.Fatalf("exit %+v %v, output %q", x, err, rest)
	}

	// Cancelling the exec's context kills it.
	cctx, cancel := context.WithCancel(ctx)
	p, err = c.Exec(cctx, proto.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	x, err = p.Wait(ctx)
	if err != nil || x.Signal != int(syscall.SIGKILL) {
		t.Fatalf("cancelled exec: %+v %v", x, err)
	}
}

func TestExecTTY(t *testing.T) {
	c, _ := startAgent(t)
	out, _, x := run(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "tty; stty size"}, TTY: true, Rows: 33, Cols: 101}, "")
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(out, "\r", "")), "\n")
	if x.Code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "/dev/pts/") || lines[1] != "33 101" {
		t.Fatalf("exit %+v, output %q", x, out)
	}
	// Resize reaches the terminal; closing stdin on a terminal is ^D.
	ctx := ctxT(t)
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"sh", "-c", "read x; stty size; cat"}, TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(50, 120); err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin, "go\n")
	p.Stdin.Close()
	b, _ := io.ReadAll(p.Stdout)
	if x, err := p.Wait(ctx); err != nil || x.Code != 0 || !strings.Contains(string(b), "50 120") {
		t.Fatalf("exit %+v %v, output %q", x, err, b)
	}
}

func TestPsAndPorts(t *testing.T) {
	c, _ := startAgent(t)
	ctx := ctxT(t)
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Signal(syscall.SIGKILL, true)
	procs, err := c.Ps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found *proto.Process
	for i := range procs {
		if procs[i].PID == p.PID {
			found = &procs[i]
		}
	}
	if found == nil || found.PPID != os.Getpid() || strings.Join(found.Argv, " ") != "sleep 30" ||
		found.User != "root" || found.RSS == 0 || time.Since(found.Start) > time.Minute {
		t.Fatalf("sleep %d in ps: %+v", p.PID, found)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ports, err := c.Ports(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := uint16(l.Addr().(*net.TCPAddr).Port)
	for _, pt := range ports {
		if pt.Port == want && pt.Proto == "tcp" && pt.Address == "127.0.0.1" && pt.PID == os.Getpid() {
			return
		}
	}
	t.Fatalf("port %d of pid %d not in %+v", want, os.Getpid(), ports)
}

func TestEventsForExec(t *testing.T) {
	c, _ := startAgent(t)
	ctx := ctxT(t)
	ev, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The listener opens a port; the events must show the start, the
	// port, the exit with its code and the port closing. Events are read
	// as they come: the agent sees every process of the host here, and a
	// busy host makes many.
	py := `import socket,time; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(0.5)`
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"python3", "-c", py}, Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []proto.Event
	go func() {
		for e := range ev {
			mu.Lock()
			got = append(got, e)
			mu.Unlock()
		}
	}()
	var portLine string
	if b, err := io.ReadAll(p.Stdout); err == nil {
		portLine = strings.TrimSpace(string(b))
	}
	x, err := p.Wait(ctx)
	if err != nil || x.Code != 0 {
		t.Fatalf("%+v %v", x, err)
	}
	seen := map[string]bool{}
	for !(seen["start"] && seen["exit"] && seen["open"] && seen["close"]) {
		if ctx.Err() != nil {
			t.Fatalf("events seen: %v (port %s)", seen, portLine)
		}
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		events := got
		got = nil
		mu.Unlock()
		for _, e := range events {
			switch {
			case e.Type == proto.EventProcessStarted && e.Process.PID == p.PID:
				seen["start"] = true
			case e.Type == proto.EventProcessExited && e.Process.PID == p.PID:
				if e.Exit == nil || e.Exit.Code != 0 || seen["exit"] {
					t.Fatalf("exit event %+v (seen twice: %v)", e, seen["exit"])
				}
				seen["exit"] = true
			case e.Type == proto.EventPortOpened && portString(e.Port) == portLine:
				seen["open"] = e.Port.PID == p.PID
			case e.Type == proto.EventPortClosed && portString(e.Port) == portLine:
				seen["close"] = true
			case e.Type == proto.EventLost:
				t.Logf("%d events lost on a busy host", e.Lost)
			}
		}
	}
}

// TestSlowEventReaderDoesNotStallExec: a caller that subscribes to events
// and reads none must not stop the execs that share its connection; the
// events it missed are counted in a "lost" event.
func TestSlowEventReaderDoesNotStallExec(t *testing.T) {
	c, _ := startAgent(t)
	ctx := ctxT(t)
	ev, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each exec makes a start and an exit event: 400 of them overflow
	// every queue between the agent and the unread channel.
	for i := 0; i < 200; i++ {
		p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"true"}, Env: os.Environ()})
		if err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
		if x, err := p.Wait(ctx); err != nil || x.Code != 0 {
			t.Fatalf("exec %d with events unread: %+v %v", i, x, err)
		}
	}
	// One more event after the queue has room again carries the count.
	n := 0
	for range len(ev) {
		<-ev
		n++
	}
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"true"}, Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait(ctx)
	for {
		select {
		case e := <-ev:
			if e.Type == proto.EventLost {
				if e.Lost <= 0 {
					t.Fatalf("lost event with count %d", e.Lost)
				}
				t.Logf("%d events queued, then %d lost", n, e.Lost)
				return
			}
		case <-ctx.Done():
			t.Fatalf("no lost event after %d queued events", n)
		}
	}
}

func portString(p *proto.Port) string { return strconv.Itoa(int(p.Port)) }

// TestAgentRefusesOtherVersion: a host speaking another protocol version
// gets an error frame naming both versions, and the connection closes.
func TestAgentRefusesOtherVersion(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	host, agent := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- a.ServeConn(agent) }()
	f, _ := proto.JSONFrame(proto.KindHello, 0, proto.Hello{Magic: proto.Magic, Version: 9})
	go proto.WriteFrame(host, f)
	got, err := proto.ReadFrame(host)
	var e proto.Error
	if err != nil || got.Kind != proto.KindError || proto.Decode(got, &e) != nil || !strings.Contains(e.Message, "version 9, this side speaks 1") {
		t.Fatalf("answer %v %q %v", got.Kind, got.Payload, err)
	}
	if err := <-done; err == nil {
		t.Fatal("ServeConn accepted version 9")
	}
	if _, err := proto.ReadFrame(host); err == nil {
		t.Fatal("the connection stayed open")
	}
}

// TestStartedEventsCarryTheirArgv: commands started one after another,
// each while scans triggered by the previous ones run, are each reported
// started with their own argv, never with the agent's (a scan that finds
// a child between its fork and its exec) or none.
func TestStartedEventsCarryTheirArgv(t *testing.T) {
	c, _ := startAgent(t)
	ctx := ctxT(t)
	ev, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]string{}
	for i := 0; i < 40; i++ {
		marker := fmt.Sprintf("argv-marker-%d", i)
		p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"sh", "-c", "exit 0", marker}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		want[p.PID] = marker
	}
	for len(want) > 0 {
		select {
		case e := <-ev:
			if e.Type != proto.EventProcessStarted || e.Process == nil {
				continue
			}
			marker, ok := want[e.Process.PID]
			if !ok {
				continue
			}
			if !slices.Contains(e.Process.Argv, marker) {
				t.Errorf("started event of pid %d has argv %q, want one with %s", e.Process.PID, e.Process.Argv, marker)
			}
			delete(want, e.Process.PID)
		case <-ctx.Done():
			t.Fatalf("no started event for %d commands", len(want))
		}
	}
}
