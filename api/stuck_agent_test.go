package api_test

import (
	"bytes"
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"tine/internal/testagent"
	"tine/sandbox"
)

// A sandbox whose agent does not answer (its pid 1 stopped from the host
// here; a sandbox's root can take it over and make it hang) is listed
// with status_error within the list's bound, and the others with their
// status: one sandbox cannot hang or fail the list for all. Its own
// status fails at the same bound.
func TestListWithAnAgentThatDoesNotAnswer(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("mute")
	e.create("fine")
	pid := testagent.InitPID(t, "mute")
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	t0 := time.Now()
	list, err := e.c.List(ctx)
	if err != nil {
		t.Fatalf("list beside a sandbox whose agent does not answer: %v", err)
	}
	if took := time.Since(t0); took > 30*time.Second {
		t.Errorf("the list took %v", took)
	}
	got := map[string]string{}
	for _, s := range list {
		got[s.Name] = s.StatusError
		if s.Name == "fine" && (s.State != sandbox.Running || s.Processes < 1) {
			t.Errorf("the other sandbox is listed as %+v", s)
		}
	}
	if len(got) != 2 || got["fine"] != "" || !strings.Contains(got["mute"], "deadline") {
		t.Fatalf("status errors %q, want one for mute alone (its deadline)", got)
	}
	if _, err := e.c.Get(ctx, "mute"); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("status of the sandbox whose agent does not answer: %v, want its deadline", err)
	}
}

// An upload to a sandbox whose agent stops reading ends with its caller
// (the connection it cut short is closed), and once the agent reads again
// the sandbox answers: the daemon dials it again rather than keeping the
// closed connection.
func TestUploadToAnAgentThatStopsReading(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("mute")
	pid := testagent.InitPID(t, "mute")
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := e.c.PutFile(short, "mute", "/tmp/big", 0o644, bytes.NewReader(make([]byte, 16<<20)))
	if err == nil {
		t.Fatal("an upload the agent never read succeeded")
	}
	syscall.Kill(pid, syscall.SIGCONT)
	stopped = false
	waitFor(t, "the sandbox answering again", func() bool {
		ps, err := e.c.Ps(ctx, "mute")
		return err == nil && len(ps) > 0
	})
}
