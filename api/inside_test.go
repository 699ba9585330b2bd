package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"tine/api"
	"tine/api/client"
	"tine/sandbox"
)

// insideEnv is a test daemon whose sandboxes reach their own API.
type insideEnv struct {
	*env
	in  *api.Inside
	srv *api.Server // the daemon's API with the approvals routes
}

func newInsideEnv(t *testing.T, o api.InsideOptions) *insideEnv {
	e := newEnv(t)
	in := api.NewInside(e.m, o)
	e.m.SetInsideAPI(in)
	t.Cleanup(func() { in.Close() })
	return &insideEnv{env: e, in: in, srv: api.NewServer(e.m, api.ServerOptions{Inside: in})}
}

// call sends one request to the API inside sandbox sb with curl (as code
// in the sandbox does) and returns the status and body.
func (e *insideEnv) call(sb, method, path, body string) (int, string) {
	e.t.Helper()
	script := fmt.Sprintf("curl -sS --path-as-is -X %s -o /tmp/body -w '%%{http_code}' --unix-socket %s", method, api.InsideSocket)
	if body != "" {
		script += " -H 'Content-Type: application/json' --data-binary " + shellQuote(body)
	}
	script += " " + shellQuote("http://tine"+path) + "; echo; cat /tmp/body"
	out := e.sh(sb, script)
	code, rest, _ := strings.Cut(out, "\n")
	var status int
	fmt.Sscan(code, &status)
	return status, rest
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// host sends one request to the daemon's own API (with Inside).
func (e *insideEnv) host(method, path, body string) (int, string) {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	e.srv.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func names(t *testing.T, body string) []string {
	t.Helper()
	var sbs []api.Sandbox
	if err := json.Unmarshal([]byte(body), &sbs); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	var out []string
	for _, s := range sbs {
		out = append(out, s.Name)
	}
	sort.Strings(out)
	return out
}

// TestInsideSelfAndTree: a sandbox sees itself, forks itself from inside,
// and its forks answer as themselves; none reaches a parent, a sibling
// or an unrelated sandbox, by name or by path tricks.
func TestInsideSelfAndTree(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{MaxTree: 4})
	e.create("a")
	e.create("b")

	st, body := e.call("a", "GET", "/v1/self", "")
	if st != 200 || !strings.Contains(body, `"name":"a"`) {
		t.Fatalf("GET /v1/self from a: %d %s", st, body)
	}
	st, body = e.call("a", "POST", "/v1/self/fork", `{"n":2}`)
	if st != 201 {
		t.Fatalf("fork from inside: %d %s", st, body)
	}
	if got := names(t, body); strings.Join(got, ",") != "a-1,a-2" {
		t.Fatalf("forks: %v", got)
	}
	st, body = e.call("a", "GET", "/v1/sandboxes", "")
	if got := names(t, body); st != 200 || strings.Join(got, ",") != "a,a-1,a-2" {
		t.Fatalf("tree of a: %d %v", st, got)
	}
	// Policy: the tree may hold 4.
	if st, body = e.call("a", "POST", "/v1/self/fork", `{"n":2}`); st != 403 || !strings.Contains(body, "forbidden") {
		t.Fatalf("fork past the tree's bound: %d %s", st, body)
	}
	// A fork's socket is its own.
	st, body = e.call("a-1", "GET", "/v1/self", "")
	if st != 200 || !strings.Contains(body, `"name":"a-1"`) || !strings.Contains(body, `"forked_from":"a"`) {
		t.Fatalf("GET /v1/self from a-1: %d %s", st, body)
	}
	// The parent may act on its fork.
	if st, body = e.call("a", "POST", "/v1/sandboxes/a-2/snapshots", `{"name":"p"}`); st != 201 {
		t.Fatalf("a snapshots its fork a-2: %d %s", st, body)
	}

	// Outside the tree: parent, sibling, unrelated; every route.
	for _, target := range []string{"a", "a-2", "b", "nosuch"} {
		for _, rq := range [][3]string{
			{"GET", "/v1/sandboxes/" + target, ""},
			{"GET", "/v1/sandboxes/" + target + "/limits", ""},
			{"GET", "/v1/sandboxes/" + target + "/snapshots", ""},
			{"POST", "/v1/sandboxes/" + target + "/snapshots", `{"name":"x"}`},
			{"POST", "/v1/sandboxes/" + target + "/fork", `{"n":1}`},
			{"POST", "/v1/sandboxes/" + target + "/rollback", `{"snapshot":"p"}`},
			{"DELETE", "/v1/sandboxes/" + target, ""},
		} {
			if st, body := e.call("a-1", rq[0], rq[1], rq[2]); st != 404 || !strings.Contains(body, "its forks") {
				t.Errorf("a-1: %s %s: %d %s, want 404", rq[0], rq[1], st, body)
			}
		}
	}
	// Path tricks: encoded slashes and dots, traversal.
	for _, p := range []string{
		"/v1/sandboxes/..%2fb/snapshots",
		"/v1/sandboxes/%2e%2e/b/snapshots",
		"/v1/sandboxes/a-1%2f..%2f..%2fb/snapshots",
		"/v1/sandboxes/a-1%2F..%2Fb/snapshots",
		"/v1/sandboxes/self/../b/snapshots",
		"/v1/self/../sandboxes/b/snapshots",
		"/v1/sandboxes/%62/snapshots",
		"/v1/sandboxes/b%00/snapshots",
		"/v1/sandboxes/.%2e/snapshots",
	} {
		st, body := e.call("a-1", "POST", p, `{"name":"trick"}`)
		if st < 300 || st == 500 {
			t.Errorf("a-1: POST %s: %d %s", p, st, body)
		}
	}
	for _, sb := range []string{"a", "a-2", "b"} {
		snaps, err := e.m.Snapshots(sb)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range snaps {
			if s.Name == "x" || s.Name == "trick" {
				t.Errorf("sandbox %s got snapshot %q from outside its tree", sb, s.Name)
			}
		}
	}
	// a may not remove itself; it may remove its fork.
	if st, _ := e.call("a", "DELETE", "/v1/sandboxes/self", ""); st != 403 {
		t.Errorf("a removes itself: %d", st)
	}
	if st, body := e.call("a", "DELETE", "/v1/sandboxes/a-2", ""); st != 204 {
		t.Errorf("a removes a-2: %d %s", st, body)
	}
}

// TestInsideSnapshotRollback: a sandbox snapshots itself, changes a file,
// rolls itself back and finds the file as it was.
func TestInsideSnapshotRollback(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	e.create("s")
	if st, body := e.call("s", "POST", "/v1/self/snapshots", `{"name":"before"}`); st != 201 {
		t.Fatalf("snapshot myself: %d %s", st, body)
	}
	e.sh("s", "echo changed > "+e.project+"/src/main.txt")
	if st, body := e.call("s", "POST", "/v1/self/rollback", `{"snapshot":"nosuch"}`); st != 404 {
		t.Fatalf("rollback to an unknown snapshot: %d %s", st, body)
	}
	// The rollback ends the command that asked for it: its output may
	// not come back.
	var out bytes.Buffer
	e.c.Exec(ctxT(t), "s", shReq(`curl -sS -w '%{http_code}' --unix-socket /run/tine/api.sock -d '{"snapshot":"before"}' http://tine/v1/self/rollback; sleep 10`), client.ExecIO{Stdout: &out})
	// The output may be cut anywhere once the rollback begins; what came
	// back must be the 202 answer (its body, its code) or a part of it.
	if o := out.String(); o != "" && !strings.Contains(o, "202") && !strings.HasPrefix(`{"note":"this sandbox's processes end now`, o) && !strings.Contains(o, `"rollback":"before"`) {
		t.Fatalf("rollback myself: %s", o)
	}
	waitFor(t, "the rollback", func() bool {
		var out bytes.Buffer
		ex, err := e.c.Exec(ctxT(t), "s", shReq("cat "+e.project+"/src/main.txt"), client.ExecIO{Stdout: &out})
		return err == nil && ex.Code == 0 && out.String() == "v1\n"
	})
	// The API answers again after the restart, as the same sandbox.
	if st, body := e.call("s", "GET", "/v1/self/snapshots", ""); st != 200 || !strings.Contains(body, `"before"`) {
		t.Fatalf("snapshots after the rollback: %d %s", st, body)
	}
}

// TestInsideSocketHeld: code in the sandbox cannot remove, move, unmount
// or replace its API socket, nor change its mode.
func TestInsideSocketHeld(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	e.create("h")
	out := e.sh("h", `
for c in "rm -f /run/tine/api.sock" "mv /run/tine/api.sock /tmp/x" "umount /run/tine/api.sock" \
	"umount -l /run/tine" "chmod 000 /run/tine/api.sock" "ln -sf /tmp/x /run/tine/api.sock" \
	"mount -t tmpfs none /run/tine"; do
	if $c 2>/dev/null; then echo "ALLOWED: $c"; fi
done
test -S /run/tine/api.sock && echo socket-there`)
	if strings.Contains(out, "ALLOWED") || !strings.Contains(out, "socket-there") {
		t.Fatalf("socket changes from inside:\n%s", out)
	}
	if st, body := e.call("h", "GET", "/v1/self", ""); st != 200 || !strings.Contains(body, `"name":"h"`) {
		t.Fatalf("API after the attempts: %d %s", st, body)
	}
}

// TestInsideResourcesAndApprovals: a raise past the policy is refused;
// one within it waits for a person, who approves it through the daemon's
// API; a question waits until a person answers.
func TestInsideResourcesAndApprovals(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{MaxLimits: sandbox.Limits{Pids: 500}})
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "r", From: e.project, Limits: sandbox.Limits{Pids: 100}}); err != nil {
		t.Fatal(err)
	}
	st, body := e.call("r", "GET", "/v1/self/limits", "")
	if st != 200 || !strings.Contains(body, `"limits":{"pids":100}`) || !strings.Contains(body, `"max":{"pids":500}`) {
		t.Fatalf("limits: %d %s", st, body)
	}
	for _, req := range []string{`{"limits":{"pids":501}}`, `{"limits":{"project_bytes":1}}`, `{"limits":{"pids":1000000000000}}`} {
		if st, body := e.call("r", "POST", "/v1/self/resources", req); st != 403 || !strings.Contains(body, "policy") {
			t.Errorf("resources %s: %d %s, want 403", req, st, body)
		}
	}
	if st, body := e.call("r", "POST", "/v1/self/resources", `{"limits":{"pids":-1}}`); st != 400 {
		t.Errorf("negative: %d %s", st, body)
	}
	st, body = e.call("r", "POST", "/v1/self/resources", `{"limits":{"pids":400},"reason":"build"}`)
	var a api.Approval
	if st != 202 || json.Unmarshal([]byte(body), &a) != nil || a.State != "pending" {
		t.Fatalf("resources within policy: %d %s", st, body)
	}
	if info, _ := e.m.Get("r"); info.Limits.Pids != 100 {
		t.Fatalf("limits changed before approval: %+v", info.Limits)
	}
	if st, body := e.host("POST", "/v1/approvals/"+a.ID+"/approve", `{"message":"ok"}`); st != 200 || !strings.Contains(body, `"approved"`) {
		t.Fatalf("approve: %d %s", st, body)
	}
	if info, _ := e.m.Get("r"); info.Limits.Pids != 400 {
		t.Fatalf("limits after approval: %+v", info.Limits)
	}
	if st, _ := e.host("POST", "/v1/approvals/"+a.ID+"/deny", ""); st != 409 {
		t.Errorf("answer twice: %d", st)
	}

	// A question that waits: the command blocks until a person answers.
	done := make(chan string, 1)
	go func() {
		_, out := e.call("r", "POST", "/v1/self/approvals", `{"reason":"push to prod?","wait":true}`)
		done <- out
	}()
	var pending []api.Approval
	waitFor(t, "the pending approval", func() bool {
		_, body := e.host("GET", "/v1/approvals?sandbox=r", "")
		pending = pending[:0]
		json.Unmarshal([]byte(body), &pending)
		return len(pending) == 2 && pending[1].State == "pending"
	})
	select {
	case out := <-done:
		t.Fatalf("answered before anyone did: %s", out)
	case <-time.After(200 * time.Millisecond):
	}
	if st, body := e.host("POST", "/v1/approvals/"+pending[1].ID+"/deny", `{"message":"no"}`); st != 200 {
		t.Fatalf("deny: %d %s", st, body)
	}
	select {
	case out := <-done:
		if !strings.Contains(out, `"denied"`) || !strings.Contains(out, `"answer":"no"`) {
			t.Fatalf("the waiting request got %s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting request did not end")
	}
	// Another sandbox sees none of r's approvals.
	e.create("o")
	if st, body := e.call("o", "GET", "/v1/self/approvals/"+a.ID, ""); st != 404 {
		t.Errorf("o reads r's approval: %d %s", st, body)
	}
	if st, body := e.call("o", "GET", "/v1/self/approvals", ""); st != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("o's approvals: %d %s", st, body)
	}
}
