package main

import (
	"bytes"
	"context"
	"debug/elf"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tine/guestagent/client"
	"tine/guestagent/proto"
)

// buildAgent builds the agent with CGO_ENABLED=0, as a sandbox gets it.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tine-agent")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// TestStaticBinary: the agent has no ELF interpreter and no dynamic
// section, so it runs in any sandbox root, with or without a libc.
func TestStaticBinary(t *testing.T) {
	f, err := elf.Open(buildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the agent binary has a %v program header; it must be static", p.Type)
		}
	}
}

// agentNS runs the agent as pid 1 of new pid, mount and network
// namespaces, serving the listening socket it inherits as fd 3.
type agentNS struct {
	cmd    *exec.Cmd
	c      *client.Client
	stderr bytes.Buffer
}

func startNS(t *testing.T) *agentNS {
	t.Helper()
	bin := buildAgent(t)
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	lf, err := l.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	sock := l.Addr().String()
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	a := &agentNS{cmd: exec.Command(bin, "--fd", "3", "--mount-proc", "--grace", "2s", "--scan-interval", "200ms")}
	a.cmd.ExtraFiles = []*os.File{lf}
	a.cmd.Stderr = &a.stderr
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	t.Cleanup(func() {
		if a.cmd.ProcessState == nil {
			a.cmd.Process.Kill()
			a.cmd.Wait()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if a.c, err = client.Dial(ctx, sock); err != nil {
		t.Fatalf("%v; agent: %s", err, &a.stderr)
	}
	t.Cleanup(func() { a.c.Close() })
	return a
}

func (a *agentNS) run(t *testing.T, req proto.ExecRequest) (string, proto.Exit) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := a.c.Exec(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	p.Stdin.Close()
	go io.Copy(io.Discard, p.Stderr)
	out, _ := io.ReadAll(p.Stdout)
	x, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return string(out), x
}

// TestPID1 runs the real agent binary as pid 1 of its own namespaces.
func TestPID1(t *testing.T) {
	a := startNS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := a.c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// ps sees the agent as pid 1 and nothing of the host.
	procs, err := a.c.Ps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 || procs[0].PID != 1 || !strings.HasSuffix(procs[0].Argv[0], "tine-agent") || procs[0].User != "root" {
		t.Fatalf("ps in a fresh namespace: %+v", procs)
	}

	// An orphaned grandchild is reaped by the agent; no zombie remains,
	// and its exit is an event with its status.
	out, x := a.run(t, proto.ExecRequest{Argv: []string{"sh", "-c", "sh -c 'sleep 0.3; exit 5' >/dev/null & echo $!"}})
	orphan, _ := strconv.Atoi(strings.TrimSpace(out))
	if x.Code != 0 || orphan == 0 {
		t.Fatalf("%q %+v", out, x)
	}
	waitEvent(t, ctx, events, func(e proto.Event) bool {
		return e.Type == proto.EventProcessExited && e.Process.PID == orphan && e.Exit != nil && e.Exit.Code == 5
	})
	procs, _ = a.c.Ps(ctx)
	for _, p := range procs {
		if p.PID != 1 {
			t.Fatalf("left after the orphan ended: %+v", p)
		}
	}

	// A listener in the sandbox shows in ports with its pid, and as an event.
	nc, err := a.c.Exec(ctx, proto.ExecRequest{Argv: []string{"busybox", "nc", "-l", "-p", "8080"}})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ctx, events, func(e proto.Event) bool {
		return e.Type == proto.EventPortOpened && e.Port.Port == 8080 && e.Port.PID == nc.PID
	})
	ports, err := a.c.Ports(ctx)
	if err != nil || len(ports) != 1 || ports[0].Port != 8080 || ports[0].PID != nc.PID || !strings.HasPrefix(ports[0].Proto, "tcp") {
		t.Fatalf("ports: %+v %v", ports, err)
	}

	// A timeout kills the process group.
	_, x = a.run(t, proto.ExecRequest{Argv: []string{"sh", "-c", "sleep 60 & sleep 60"}, Timeout: 300 * time.Millisecond})
	if !x.TimedOut || x.Signal != int(syscall.SIGKILL) {
		t.Fatalf("timeout: %+v", x)
	}

	// A terminal: tty names /dev/pts/N and stty sees the window size.
	out, x = a.run(t, proto.ExecRequest{Argv: []string{"sh", "-c", "tty; stty size"}, TTY: true, Rows: 40, Cols: 132})
	if f := strings.Fields(out); x.Code != 0 || len(f) != 3 || !strings.HasPrefix(f[0], "/dev/pts/") || f[1] != "40" || f[2] != "132" {
		t.Fatalf("tty: %q %+v", out, x)
	}

	// SIGTERM to the agent reaches every process, which may clean up, and
	// the agent exits 0.
	trap, err := a.c.Exec(ctx, proto.ExecRequest{Argv: []string{"sh", "-c", "trap 'echo cleaned; exit 0' TERM; echo ready; while :; do sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	io.ReadFull(trap.Stdout, buf)
	a.cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(trap.Stdout)
	if string(rest) != "cleaned\n" {
		t.Errorf("the trapping process printed %q after the agent's SIGTERM", rest)
	}
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("agent exit: %v; stderr: %s", err, &a.stderr)
	}
	nc.Wait(ctx)
}

func waitEvent(t *testing.T, ctx context.Context, events <-chan proto.Event, match func(proto.Event) bool) {
	t.Helper()
	for {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("event stream ended")
			}
			if match(e) {
				return
			}
		case <-ctx.Done():
			t.Fatal("no matching event before the deadline")
		}
	}
}

// TestVersion: the binary states its version and protocol.
func TestVersion(t *testing.T) {
	out, err := exec.Command(buildAgent(t), "--version").Output()
	if err != nil || !strings.Contains(string(out), "protocol "+strconv.Itoa(proto.Version)) {
		t.Fatalf("%q %v", out, err)
	}
}
