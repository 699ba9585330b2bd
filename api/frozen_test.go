package api_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"tine/api/client"
	"tine/sandbox"
)

// TestFrozenSandboxAnswersAtOnce: what needs a frozen sandbox's agent
// (ps, ports, files) is refused at once with 409 naming the freeze and
// the way out, instead of waiting for a thaw; the event stream still
// opens, and everything answers again after the thaw.
func TestFrozenSandboxAnswersAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("cold")
	if err := e.c.Freeze(ctx, "cold"); err != nil {
		t.Fatal(err)
	}
	// Each refusal must come well before a wait for the agent would end
	// (5 s, however loaded the machine); the stream gets longer.
	calls := map[string]func(context.Context) error{
		"ps":    func(short context.Context) error { _, err := e.c.Ps(short, "cold"); return err },
		"ports": func(short context.Context) error { _, err := e.c.Ports(short, "cold"); return err },
		"get file": func(short context.Context) error {
			return e.c.GetFile(short, "cold", "/etc/hostname", io.Discard)
		},
	}
	for what, call := range calls {
		start := time.Now()
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := call(short)
		cancel()
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Status != 409 || !strings.Contains(ae.Message, "frozen") || !strings.Contains(ae.Message, "tine thaw cold") {
			t.Errorf("%s of a frozen sandbox after %v: %v, want 409 naming the freeze and tine thaw", what, time.Since(start), err)
		}
	}
	stream, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ev, err := e.c.Events(stream, "cold")
	if err != nil {
		t.Fatalf("events of a frozen sandbox: %v", err)
	}
	if err := e.c.Thaw(ctx, "cold"); err != nil {
		t.Fatal(err)
	}
	for thawed := false; !thawed; {
		select {
		case ev, ok := <-ev:
			if !ok {
				t.Fatal("event stream ended before the thaw was seen")
			}
			thawed = ev.Type == sandbox.EventThawed
		case <-stream.Done():
			t.Fatal("no thawed event on a stream opened while frozen")
		}
	}
	if ps, err := e.c.Ps(ctx, "cold"); err != nil || len(ps) == 0 {
		t.Errorf("ps after thaw: %v %v", ps, err)
	}
}
