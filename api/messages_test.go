package api_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"tine/api"
	"tine/sandbox"
)

// messages decodes a GET /v1/messages answer.
func messages(t *testing.T, body string) []api.Message {
	t.Helper()
	var out []api.Message
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return out
}

// send sends body from inside sandbox from to sandbox to.
func (e *insideEnv) send(from, to, body string) (int, string) {
	e.t.Helper()
	return e.call(from, "POST", "/v1/messages", fmt.Sprintf(`{"to":%q,"body":%s}`, to, body))
}

// raw sends one request from inside sandbox sb and returns the whole
// answer, status line and headers included, without its Date header.
func (e *insideEnv) raw(sb, method, path, body string) string {
	e.t.Helper()
	out := e.sh(sb, fmt.Sprintf("curl -sS -i --path-as-is -X %s --unix-socket %s -H 'Content-Type: application/json' --data-binary %s %s",
		method, api.InsideSocket, shellQuote(body), shellQuote("http://tine"+path)))
	return regexp.MustCompile(`(?m)^Date: .*\r\n`).ReplaceAllString(out, "")
}

// TestMessagesPolicy: by default a sandbox messages its parent, its
// siblings and its forks at any depth; anything else is a 404 the same,
// byte for byte, as for a sandbox that does not exist; none and globs
// narrow and widen it, and forks inherit it.
func TestMessagesPolicy(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	e.create("a")
	e.create("b")
	if _, err := e.c.Fork(ctxT(t), "a", api.ForkRequest{N: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Fork(ctxT(t), "a-1", api.ForkRequest{N: 1}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to string }{
		{"a-1", "a"}, {"a-1", "a-2"}, {"a", "a-1"}, {"a", "a-1-1"}, {"a-1-1", "a-1"}, {"a-1", "a-1-1"}, {"a", "a"},
	} {
		if st, body := e.send(c.from, c.to, `{"hi":"from `+c.from+`"}`); st != 201 || !strings.Contains(body, `"from":"`+c.from+`"`) || !strings.Contains(body, `"sha256":"`) {
			t.Errorf("%s -> %s: %d %s, want 201", c.from, c.to, st, body)
		}
	}
	st, body := e.call("a-2", "GET", "/v1/messages", "")
	if got := messages(t, body); st != 200 || len(got) != 1 || got[0].From != "a-1" || string(got[0].Body) != `{"hi":"from a-1"}` {
		t.Fatalf("a-2's inbox: %d %s", st, body)
	}
	// Outside the family: the grandparent, the parent's sibling, an
	// unrelated sandbox, one that does not exist.
	for _, c := range []struct{ from, to string }{{"a-1-1", "a"}, {"a-1-1", "a-2"}, {"a", "b"}, {"b", "a"}, {"a-1", "nosuch"}} {
		if st, body := e.send(c.from, c.to, `1`); st != 404 {
			t.Errorf("%s -> %s: %d %s, want 404", c.from, c.to, st, body)
		}
	}
	// An unrelated sandbox that exists, then the same name gone: the
	// same answer, byte for byte.
	exists := e.raw("a", "POST", "/v1/messages", `{"to":"b","body":"x"}`)
	if !strings.HasPrefix(exists, "HTTP/1.1 404") {
		t.Fatalf("to an unrelated sandbox: %s", exists)
	}
	if err := e.c.Remove(ctxT(t), "b"); err != nil {
		t.Fatal(err)
	}
	if gone := e.raw("a", "POST", "/v1/messages", `{"to":"b","body":"x"}`); gone != exists {
		t.Errorf("to an unrelated sandbox:\n%s\nto a missing one:\n%s", exists, gone)
	}
	e.create("b")
	if got, _ := e.m.Messages(ctxT(t), "b", sandbox.ReadOptions{}); len(got) != 0 {
		t.Errorf("b got %d messages from outside its family", len(got))
	}

	// none, inherited by forks, shown in the status.
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "n", From: e.project, MessageTo: "none"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Fork(ctxT(t), "n", api.ForkRequest{N: 1}); err != nil {
		t.Fatal(err)
	}
	if st, body := e.send("n", "n-1", `1`); st != 404 {
		t.Errorf("none: n -> n-1: %d %s", st, body)
	}
	if st, body := e.send("n-1", "n", `1`); st != 404 {
		t.Errorf("none, inherited: n-1 -> n: %d %s", st, body)
	}
	if sb, err := e.c.Get(ctxT(t), "n-1"); err != nil || sb.MessageTo != "none" {
		t.Errorf("n-1's message_to: %+v %v", sb, err)
	}
	// The host still messages it.
	if _, err := e.c.Send(ctxT(t), "n-1", json.RawMessage(`"from the host"`)); err != nil {
		t.Errorf("host -> n-1: %v", err)
	}

	// Globs widen the family.
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "g", From: e.project, MessageTo: "family,b*,x?"}); err != nil {
		t.Fatal(err)
	}
	if st, body := e.send("g", "b", `"by glob"`); st != 201 {
		t.Errorf("glob: g -> b: %d %s", st, body)
	}
	if st, body := e.send("g", "a", `1`); st != 404 {
		t.Errorf("glob: g -> a: %d %s", st, body)
	}
	if st, body := e.send("g", "xy", `1`); st != 404 || !strings.Contains(body, "not found") {
		t.Errorf("glob, no such sandbox: g -> xy: %d %s", st, body)
	}
	if st, body := e.call("b", "GET", "/v1/messages?take=true", ""); st != 200 || len(messages(t, body)) != 1 || messages(t, body)[0].From != "g" {
		t.Errorf("b's inbox: %d %s", st, body)
	}
	for _, bad := range []string{"none,family", "a/b", "[", "family,../x"} {
		if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "bad", From: e.project, MessageTo: bad}); err == nil || !strings.Contains(err.Error(), "message_to") {
			t.Errorf("create with message_to %q: %v", bad, err)
		}
	}
}

// TestMessagesHostile: a sandbox cannot name its sender, overflow a body
// or an inbox, or reach another sandbox by path tricks in the name; the
// audit log records each message by hash and size, never its body.
func TestMessagesHostile(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	e.create("a")
	e.create("z") // unrelated
	if _, err := e.c.Fork(ctxT(t), "a", api.ForkRequest{N: 1}); err != nil {
		t.Fatal(err)
	}
	// Reads in progress at once are bounded: each may hold the inbox in
	// memory.
	out := e.sh("a", fmt.Sprintf(`for i in 1 2 3 4; do curl -sS -o /dev/null --unix-socket %[1]s 'http://tine/v1/messages?wait=30s' >/dev/null 2>&1 & done
sleep 1.5
curl -sS -o /dev/null -w '%%{http_code}' --unix-socket %[1]s http://tine/v1/messages`, api.InsideSocket))
	if out != "429" {
		t.Errorf("a fifth read of an inbox at once: %q, want 429", out)
	}
	if _, err := e.c.Send(ctxT(t), "a", json.RawMessage(`"wake"`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiting reads to end", func() bool {
		st, _ := e.call("a", "GET", "/v1/messages?take=true", "")
		return st == 200
	})

	// Spoofing the sender, in any spelling.
	for _, body := range []string{`{"to":"a-1","from":"host","body":1}`, `{"to":"a-1","From":"z","body":1}`, `{"to":"a-1","SENDER":"host","body":1}`, `{"to":"a-1","body":1,"from":"a"}`} {
		if st, out := e.call("a", "POST", "/v1/messages", body); st != 400 || !strings.Contains(out, "sender") {
			t.Errorf("spoof %s: %d %s", body, st, out)
		}
	}
	// Malformed bodies.
	for _, body := range []string{`{"to":"a-1"}`, `{"to":"a-1","body":null}`, `{"body":1}`, `{"to":"a-1","body":1}{"to":"z","body":1}`, `[1]`, `{"to":"a-1","body":1,"x":2}`} {
		if st, out := e.call("a", "POST", "/v1/messages", body); st != 400 {
			t.Errorf("malformed %s: %d %s", body, st, out)
		}
	}
	// Path tricks in the target's name, and in the path.
	for _, to := range []string{"../z", "a-1/../../z", "z\u0000", ".", "..", "%2e%2e/z", "a-1/../z", "/z", "z/", strings.Repeat("z", 64), "self/../z"} {
		if st, out := e.send("a", to, `"trick"`); st != 400 && st != 404 {
			t.Errorf("to %q: %d %s", to, st, out)
		}
	}
	for _, p := range []string{"/v1/messages/../sandboxes/z/messages", "/v1/sandboxes/z/messages", "/v1/messages%2f..%2fz", "/v1/messages/z"} {
		if st, out := e.call("a", "POST", p, `{"to":"z","body":"trick"}`); st < 300 || st == 500 {
			t.Errorf("POST %s: %d %s", p, st, out)
		}
	}
	if got, _ := e.m.Messages(ctxT(t), "z", sandbox.ReadOptions{}); len(got) != 0 {
		t.Fatalf("z got messages by tricks: %+v", got)
	}
	// Every message a-1 got says it came from a.
	st, body := e.call("a-1", "GET", "/v1/messages", "")
	if st != 200 || len(messages(t, body)) != 0 {
		t.Fatalf("a-1 got messages from refused requests: %d %s", st, body)
	}

	// A body over 64 KiB: 413; one of 64 KiB exactly: taken.
	out = e.sh("a", fmt.Sprintf(`
big() { printf '{"to":"a-1","body":"'; head -c $1 /dev/zero | tr '\0' x; printf '"}'; }
big %d > /tmp/over; big %d > /tmp/fits
for f in over fits; do curl -sS -o /dev/null -w '%%{http_code} ' --unix-socket %s -H 'Content-Type: application/json' --data-binary @/tmp/$f http://tine/v1/messages; done`,
		sandbox.MaxMessageBytes-1, sandbox.MaxMessageBytes-2, api.InsideSocket))
	if out != "413 201 " {
		t.Errorf("bodies of 64 KiB + 1 and 64 KiB (as JSON): %q, want 413 201", out)
	}

	// A full inbox: 429, naming the target; the message count bound,
	// then the bytes bound.
	for i := 0; i < sandbox.MaxInboxMessages-1; i++ {
		if _, err := e.c.Send(ctxT(t), "a-1", json.RawMessage(fmt.Sprint(i))); err != nil {
			t.Fatalf("host message %d: %v", i, err)
		}
	}
	if st, body := e.send("a", "a-1", `"one too many"`); st != 429 || !strings.Contains(body, `"full"`) || !strings.Contains(body, `\"a-1\"`) {
		t.Fatalf("full inbox (count): %d %s", st, body)
	}
	if st, body := e.call("a-1", "GET", "/v1/messages?take=true", ""); st != 200 || len(messages(t, body)) != sandbox.MaxInboxMessages {
		t.Fatalf("take all: %d, %d bytes", st, len(body))
	}
	chunk := json.RawMessage(`"` + strings.Repeat("y", sandbox.MaxMessageBytes-2) + `"`)
	for i := 0; i < sandbox.MaxInboxBytes/sandbox.MaxMessageBytes; i++ {
		if _, err := e.c.Send(ctxT(t), "a-1", chunk); err != nil {
			t.Fatalf("host message %d of 64 KiB: %v", i, err)
		}
	}
	if st, body := e.send("a", "a-1", `"x"`); st != 429 || !strings.Contains(body, `\"a-1\"`) {
		t.Fatalf("full inbox (bytes): %d %s", st, body)
	}
	if st, body := e.call("a-1", "GET", "/v1/messages?take=true", ""); st != 200 || len(messages(t, body)) != 64 {
		t.Fatalf("take the big ones: %d, %d bytes", st, len(body))
	}

	// A sandbox named host cannot send: its messages would read as the
	// host's.
	e.create("host")
	if st, body := e.send("host", "host", `1`); st != 403 {
		t.Errorf("from a sandbox named host: %d %s", st, body)
	}

	// The audit log: the body's hash and size, never the body.
	// (The text is made in the sandbox: the exec's record holds its
	// command line.)
	secret := base64.StdEncoding.EncodeToString([]byte("the-secret-body-text"))
	if out := e.sh("a", fmt.Sprintf(`printf '{"to":"a-1","body":"%%s"}' "$(echo %s | base64 -d)" > /tmp/m
curl -sS -o /dev/null -w '%%{http_code}' --unix-socket %s --data-binary @/tmp/m http://tine/v1/messages`, secret, api.InsideSocket)); out != "201" {
		t.Fatalf("send: %s", out)
	}
	p, _ := e.m.AuditPath("a")
	log, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	dlog, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(p)), "daemon.jsonl"))
	if strings.Contains(string(log)+string(dlog), "the-secret-body-text") {
		t.Errorf("the audit log holds a message body")
	}
	if !regexp.MustCompile(`"kind":"message".*"bytes":22.*"sha256":"[0-9a-f]{64}"`).Match(log) {
		t.Errorf("no message record with hash and size in a's audit log:\n%s", log)
	}
	if !strings.Contains(string(log), `"message_refused"`) {
		t.Errorf("no record of the refused messages in a's audit log")
	}
}

// restart ends the daemon and starts it again on the same state root,
// with the sandboxes' API, and starts sandboxes names again.
func (e *insideEnv) restart(names ...string) {
	e.t.Helper()
	e.in.Close()
	e.stop()
	e.start()
	e.in = api.NewInside(e.m, api.InsideOptions{})
	e.m.SetInsideAPI(e.in)
	e.t.Cleanup(func() { e.in.Close() })
	for _, n := range names {
		if err := e.c.Start(ctxT(e.t), n); err != nil {
			e.t.Fatal(err)
		}
	}
}

// TestMessagesWaitAndRestart: a reader waiting on its inbox gets a
// message as it arrives; what was answered survives daemon restarts,
// taken messages stay taken, and ids keep growing.
func TestMessagesWaitAndRestart(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	e.create("p")
	if _, err := e.c.Fork(ctxT(t), "p", api.ForkRequest{N: 1}); err != nil {
		t.Fatal(err)
	}
	// A long poll: it waits, and ends when the message comes.
	type answer struct {
		st   int
		body string
		took time.Duration
	}
	done := make(chan answer, 1)
	go func() {
		start := time.Now()
		st, body := e.call("p-1", "GET", "/v1/messages?wait=30s&take=true", "")
		done <- answer{st, body, time.Since(start)}
	}()
	time.Sleep(1500 * time.Millisecond)
	select {
	case a := <-done:
		t.Fatalf("the wait ended with no message: %d %s", a.st, a.body)
	default:
	}
	if st, body := e.send("p", "p-1", `"first"`); st != 201 {
		t.Fatalf("send: %d %s", st, body)
	}
	var first api.Message
	select {
	case a := <-done:
		got := messages(t, a.body)
		if a.st != 200 || len(got) != 1 || string(got[0].Body) != `"first"` || a.took > 20*time.Second {
			t.Fatalf("the waiting read: %d %s after %v", a.st, a.body, a.took)
		}
		first = got[0]
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting read did not end")
	}
	// An empty wait ends after its time with nothing.
	if st, body := e.call("p-1", "GET", "/v1/messages?wait=1", ""); st != 200 || strings.TrimSpace(body) != "[]" {
		t.Fatalf("empty wait: %d %s", st, body)
	}

	// Answered messages survive a restart, as does the taking of the
	// first.
	for _, b := range []string{`"second"`, `{"n":3}`} {
		if st, body := e.send("p", "p-1", b); st != 201 {
			t.Fatalf("send: %d %s", st, body)
		}
	}
	if _, err := e.c.Send(ctxT(t), "p-1", json.RawMessage(`"from the host"`)); err != nil {
		t.Fatal(err)
	}
	e.restart("p", "p-1")
	st, body := e.call("p-1", "GET", fmt.Sprintf("/v1/messages?after=%d", first.ID), "")
	got := messages(t, body)
	if st != 200 || len(got) != 3 || string(got[0].Body) != `"second"` || string(got[1].Body) != `{"n":3}` || got[2].From != "host" || got[0].ID <= first.ID {
		t.Fatalf("after a restart: %d %s", st, body)
	}
	if st, body := e.call("p-1", "GET", "/v1/messages?take=true&after="+fmt.Sprint(got[0].ID), ""); st != 200 || len(messages(t, body)) != 2 {
		t.Fatalf("take after: %d %s", st, body)
	}
	e.restart("p", "p-1")
	st, body = e.call("p-1", "GET", "/v1/messages", "")
	if left := messages(t, body); st != 200 || len(left) != 1 || left[0].ID != got[0].ID {
		t.Fatalf("after take and restart: %d %s", st, body)
	}
	e.call("p-1", "GET", "/v1/messages?take=true", "")
	e.restart("p", "p-1")
	// A reader waiting across nothing: the next message's id is above
	// every earlier one although the inbox was emptied.
	if st, body := e.send("p", "p-1", `"after"`); st != 201 || !strings.Contains(body, fmt.Sprintf(`"id":%d`, got[2].ID+1)) {
		t.Fatalf("id after an emptied inbox and a restart: %d %s (last was %d)", st, body, got[2].ID)
	}
	// The host reads the inbox too.
	hm, err := e.c.Messages(ctxT(t), "p-1", sandbox.ReadOptions{Take: true, Wait: time.Second})
	if err != nil || len(hm) != 1 || string(hm[0].Body) != `"after"` {
		t.Fatalf("host read: %+v %v", hm, err)
	}
}
