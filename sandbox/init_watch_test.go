package sandbox_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tine/guestagent/proto"
	"tine/internal/testagent"
	"tine/sandbox"
)

// TestInitEndedStopsSandbox: when a sandbox's pid 1 (its guest agent)
// is killed from outside, with no stop asked for, a command running in
// it ends with SIGKILL and a reason rather than a dropped connection,
// the sandbox is saved as stopped with that reason, and a start runs it
// again and clears the reason.
func TestInitEndedStopsSandbox(t *testing.T) {
	e := newEnv(t, 0)
	e.create("w", sandbox.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := e.m.Exec(ctx, "w", proto.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	pid1 := testagent.InitPID(t, "w")
	if err := syscall.Kill(pid1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ex, err := p.Wait(ctx)
	if err != nil || ex.Signal != 9 || ex.KilledBy != proto.KilledStopped || !strings.Contains(ex.KilledReason, "pid 1") {
		t.Fatalf("command in a sandbox whose pid 1 was killed: %+v, %v; want SIGKILL, killed_by stopped naming pid 1", ex, err)
	}
	var info *sandbox.Info
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if info, err = e.m.Get("w"); err != nil {
			t.Fatal(err)
		}
		if info.State == sandbox.Stopped || time.Now().After(deadline) {
			break
		}
	}
	if info.State != sandbox.Stopped || !strings.Contains(info.StopReason, "pid 1") {
		t.Fatalf("sandbox after its pid 1 was killed: state %q, reason %q; want stopped with the reason", info.State, info.StopReason)
	}
	if _, err := e.m.Exec(ctx, "w", proto.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrNotRunning) {
		t.Fatalf("exec in the stopped sandbox: %v, want ErrNotRunning", err)
	}
	if err := e.m.Start(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("w", "echo up"); out != "up\n" {
		t.Fatalf("after restart: %q", out)
	}
	if info, _ := e.m.Get("w"); info.State != sandbox.Running || info.StopReason != "" {
		t.Fatalf("restarted sandbox: state %q, reason %q; want running, no reason", info.State, info.StopReason)
	}
}

// TestStopAndRemoveAtOnce: a removal that races a stop (or the pid-1
// watcher's stop) waits for that stop to end, so that it finds the
// project unmounted and deletes the branch, rather than failing with
// "branch is mounted" and leaving it behind.
func TestStopAndRemoveAtOnce(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	for i := range 5 {
		name := "r" + strconv.Itoa(i)
		e.create(name, sandbox.Limits{})
		stopped := make(chan error, 1)
		go func() { stopped <- e.m.Stop(ctx, name) }()
		// Remove once the stop has begun: the sandbox no longer runs,
		// its processes and project mount are still going.
		for {
			if _, err := e.m.Agent(ctx, name); errors.Is(err, sandbox.ErrNotRunning) {
				break
			}
		}
		if err := e.m.Remove(ctx, name); err != nil {
			t.Fatalf("remove racing a stop: %v", err)
		}
		if err := <-stopped; err != nil {
			t.Fatalf("stop racing a removal: %v", err)
		}
		if _, err := e.m.Get(name); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("after the removal: %v", err)
		}
		if _, err := e.fs.Resolve(ctx, "sandbox."+name); err == nil {
			t.Fatalf("branch sandbox.%s left behind", name)
		}
	}
}
