package api_test

import (
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"tine/api"
	"tine/api/client"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// hog holds 150 MB in a shell variable: over a 64 MiB limit the OOM
// killer kills the shell, the sandbox's largest process.
const hog = `x=$(head -c 150000000 /dev/zero | tr '\0' a); echo ${#x}`

// TestExecKilled: a command killed from outside itself ends with SIGKILL
// and an exit that says why, over the streaming endpoint and the
// WebSocket alike: the sandbox's memory limit (oom, also when a shell
// reports its child's kill as status 137), the sandbox stopped, removed,
// or removed past its lifetime while the command ran. A SIGKILL the
// command sends itself says nothing.
func TestExecKilled(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	lim := sandbox.Limits{LimitsExt: sandbox.LimitsExt{MemoryBytes: 64 << 20}}
	if _, err := e.c.Create(ctx, api.CreateRequest{Name: "m", From: e.project, Limits: lim}); err != nil {
		t.Fatal(err)
	}
	for _, ws := range []bool{false, true} {
		var in io.Reader
		if ws {
			in = strings.NewReader("")
		}
		_, _, ex := e.run("m", shReq(hog), in)
		if ex.Signal != 9 || ex.Code != -1 || ex.KilledBy != proto.KilledOOM || ex.KilledReason != "out of memory (memory limit 64 MiB)" {
			t.Errorf("hog over 64 MiB (ws %v): %+v, want SIGKILL, killed_by oom", ws, ex)
		}
	}
	// A shell that waited for the hog exits 137 itself.
	_, _, ex := e.run("m", api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"sh", "-c", `sh -c "$1"; exit $?`, "sh", hog}}}, nil)
	if ex.Code != 137 || ex.Signal != 0 || ex.KilledBy != proto.KilledOOM || !strings.Contains(ex.KilledReason, "a process it ran was killed") {
		t.Errorf("a shell whose child was OOM-killed: %+v, want code 137, killed_by oom", ex)
	}
	if _, _, ex := e.run("m", shReq(`kill -9 $$`), nil); ex.Signal != 9 || ex.KilledBy != "" {
		t.Errorf("kill -9 $$: %+v, want SIGKILL and no killed_by", ex)
	}

	// Stopped, then removed, under a running command.
	killWhile := func(name string, ws bool, kill func() error) proto.Exit {
		t.Helper()
		ready := &readyWriter{ch: make(chan struct{})}
		eio := client.ExecIO{Stdout: ready, Stderr: io.Discard}
		if ws {
			eio.Stdin = strings.NewReader("")
		}
		type result struct {
			ex  proto.Exit
			err error
		}
		done := make(chan result, 1)
		go func() {
			ex, err := e.c.Exec(ctx, name, shReq("echo ready; exec sleep 60"), eio)
			done <- result{ex, err}
		}()
		select {
		case <-ready.ch:
		case r := <-done:
			t.Fatalf("sleep in %s ended before its kill: %+v %v", name, r.ex, r.err)
		}
		if err := kill(); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("sleep in %s (ws %v): %v", name, ws, r.err)
			}
			return r.ex
		case <-time.After(20 * time.Second):
			t.Fatalf("sleep in %s: no exit 20 s after its sandbox was killed", name)
		}
		return proto.Exit{}
	}
	e.create("s")
	for _, ws := range []bool{false, true} {
		ex := killWhile("s", ws, func() error { return e.c.Stop(ctx, "s") })
		if ex.Signal != 9 || ex.Code != -1 || ex.KilledBy != proto.KilledStopped || ex.KilledReason != "the sandbox was stopped" {
			t.Errorf("sleep in a sandbox stopped under it (ws %v): %+v, want SIGKILL, killed_by stopped", ws, ex)
		}
		if err := e.c.Start(ctx, "s"); err != nil {
			t.Fatal(err)
		}
	}
	ex = killWhile("s", false, func() error { return e.c.Remove(ctx, "s") })
	if ex.Signal != 9 || ex.KilledBy != proto.KilledRemoved {
		t.Errorf("sleep in a sandbox removed under it: %+v, want SIGKILL, killed_by removed", ex)
	}

	// Past its lifetime: the watch loop removes it within a second.
	lim = sandbox.Limits{LimitsExt: sandbox.LimitsExt{Lifetime: 3 * time.Second}}
	if _, err := e.c.Create(ctx, api.CreateRequest{Name: "l", From: e.project, Limits: lim}); err != nil {
		t.Fatal(err)
	}
	ex = killWhile("l", false, func() error { return nil })
	if ex.Signal != 9 || ex.KilledBy != proto.KilledLifetime || ex.KilledReason != "the sandbox reached its --lifetime 3s and was removed" {
		t.Errorf("sleep in a sandbox past its lifetime: %+v, want SIGKILL, killed_by lifetime", ex)
	}
}

// readyWriter closes ch at the first write.
type readyWriter struct {
	once sync.Once
	ch   chan struct{}
}

func (w *readyWriter) Write(b []byte) (int, error) {
	w.once.Do(func() { close(w.ch) })
	return len(b), nil
}
