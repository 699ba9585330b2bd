package mcp_test

import (
	"strings"
	"testing"

	"tine/api"
	"tine/mcp"
	"tine/sandbox"
)

// TestMessagesTools: the send and messages tools deliver and read a
// sandbox's inbox, take what they read, pass message_to on create, and
// reach only the session's sandboxes.
func TestMessagesTools(t *testing.T) {
	e := newEnv(t)
	a := e.session(mcp.Options{}, nil)
	b := e.session(mcp.Options{}, nil)
	call(t, a, tool("create", map[string]any{"from": e.project, "name": "inbox", "message_to": "family,w-*"}), nil)
	if sb, err := e.c.Get(ctxT(t), "inbox"); err != nil || sb.MessageTo != "family,w-*" {
		t.Fatalf("message_to: %+v %v", sb, err)
	}
	var sent mcp.SendOut
	call(t, a, tool("send", map[string]any{"sandbox": "inbox", "message": "hello"}), &sent)
	if sent.ID != 1 || sent.Bytes != 7 || len(sent.SHA256) != 64 {
		t.Errorf("send: %+v", sent)
	}
	call(t, a, tool("send", map[string]any{"sandbox": "inbox", "message": `{"task":2}`, "raw": true}), nil)
	if msg := callFails(t, a, tool("send", map[string]any{"sandbox": "inbox", "message": "{", "raw": true})); !strings.Contains(msg, "JSON") {
		t.Errorf("raw, not JSON: %q", msg)
	}
	var got mcp.MessagesOut
	call(t, a, tool("messages", map[string]any{"sandbox": "inbox", "take": true}), &got)
	if len(got.Messages) != 2 || got.Messages[0].Body != "hello" || got.Messages[0].From != "host" {
		t.Fatalf("messages: %+v", got)
	}
	if m, ok := got.Messages[1].Body.(map[string]any); !ok || m["task"] != float64(2) {
		t.Errorf("raw body: %#v", got.Messages[1].Body)
	}
	call(t, a, tool("messages", map[string]any{"sandbox": "inbox", "wait_seconds": 0.2}), &got)
	if len(got.Messages) != 0 {
		t.Errorf("after take: %+v", got)
	}
	if msg := callFails(t, a, tool("messages", map[string]any{"sandbox": "inbox", "wait_seconds": 301})); !strings.Contains(msg, "wait_seconds") {
		t.Errorf("wait too long: %q", msg)
	}
	// Another session, and a sandbox made outside any session: not found.
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "theirs", From: e.project}); err != nil {
		t.Fatal(err)
	}
	for _, tl := range []string{"send", "messages"} {
		for _, n := range []string{"inbox", "theirs"} {
			cs := b
			if n == "theirs" {
				cs = a
			}
			args := map[string]any{"sandbox": n}
			if tl == "send" {
				args["message"] = "x"
			}
			msg := callFails(t, cs, tool(tl, args))
			if !strings.Contains(msg, "not found among this session's sandboxes") {
				t.Errorf("%s %s from another session: %q", tl, n, msg)
			}
		}
	}
	if got, _ := e.c.Messages(ctxT(t), "theirs", sandbox.ReadOptions{}); len(got) != 0 {
		t.Errorf("theirs got %d messages", len(got))
	}
}
