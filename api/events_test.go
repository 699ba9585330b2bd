package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"tine/api"
	"tine/guestagent/proto"
)

// TestExecDefaultDir: a command given no working directory starts in the
// sandbox's project directory; one given a directory starts there.
func TestExecDefaultDir(t *testing.T) {
	e := newEnv(t)
	sb := e.create("cwd")
	if out := e.sh(sb.Name, "pwd"); out != e.project+"\n" {
		t.Errorf("exec without dir ran in %q, want the project directory %s", out, e.project)
	}
	req := shReq("pwd")
	req.Dir = "/tmp"
	if out, _, ex := e.run(sb.Name, req, nil); out != "/tmp\n" || ex.Code != 0 {
		t.Errorf("exec with dir /tmp: %q, exit %+v", out, ex)
	}
}

// TestEventsStream: GET /v1/sandboxes/{name}/events, read through the
// client, carries a real command's process-started and process-exited
// events, the exit with the command's status.
func TestEventsStream(t *testing.T) {
	e := newEnv(t)
	sb := e.create("ev")
	ctx, cancel := context.WithTimeout(ctxT(t), 30*time.Second)
	defer cancel()
	ch, err := e.c.Events(ctx, sb.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The stream is open once the daemon answered; the agent watches from
	// then on. A marker in argv tells this command apart from others.
	const marker = "events-test-marker"
	out, _, ex := e.run(sb.Name, api.ExecRequest{ExecRequest: proto.ExecRequest{
		Argv: []string{"sh", "-c", "sleep 0.3; echo " + marker + "; exit 5"}}}, nil)
	if out != marker+"\n" || ex.Code != 5 {
		t.Fatalf("exec: %q, exit %+v", out, ex)
	}
	var started *proto.Process
	for {
		var ev proto.Event
		select {
		case v, ok := <-ch:
			if !ok {
				t.Fatalf("event stream ended; started %+v, no exit of pid %d", started, ex.PID)
			}
			ev = v
		case <-ctx.Done():
			t.Fatalf("no exit event for pid %d within 30s (started: %+v)", ex.PID, started)
		}
		switch ev.Type {
		case proto.EventProcessStarted:
			if ev.Process != nil && ev.Process.PID == ex.PID {
				started = ev.Process
				if !strings.Contains(strings.Join(ev.Process.Argv, " "), marker) {
					t.Errorf("started event of pid %d has argv %q", ex.PID, ev.Process.Argv)
				}
			}
		case proto.EventProcessExited:
			pid := 0
			if ev.Process != nil {
				pid = ev.Process.PID
			}
			if ev.Exit != nil && ev.Exit.PID != 0 {
				pid = ev.Exit.PID
			}
			if pid != ex.PID {
				continue
			}
			if started == nil {
				t.Errorf("exit event of pid %d came without a start event", ex.PID)
			}
			if ev.Exit == nil || ev.Exit.Code != 5 {
				t.Errorf("exit event of pid %d: %+v, want code 5", ex.PID, ev.Exit)
			}
			return
		}
	}
}
