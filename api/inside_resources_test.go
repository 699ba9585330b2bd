package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tine/api"
	"tine/api/client"
	"tine/sandbox"
)

// cgroupFile reads a v1 cgroup file of sandbox sb (or the v2 file that
// holds the same value), as the kernel has it.
func cgroupFile(t *testing.T, sb, ctrl, file string) string {
	t.Helper()
	pattern := filepath.Join("/sys/fs/cgroup", ctrl, "tine", "tine-*-"+sb, file)
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		v2 := map[string]string{"memory.limit_in_bytes": "memory.max", "cpu.cfs_quota_us": "cpu.max", "pids.max": "pids.max", "freezer.state": "cgroup.freeze"}[file]
		pattern = filepath.Join("/sys/fs/cgroup", "tine", "tine-*-"+sb, v2)
	}
	m, _ := filepath.Glob(pattern)
	if len(m) != 1 {
		t.Fatalf("cgroup file %s: found %v", pattern, m)
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	v, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ") // v2 cpu.max: "QUOTA PERIOD"
	switch v {
	case "1":
		if file == "freezer.state" {
			return "FROZEN"
		}
	case "0":
		if file == "freezer.state" {
			return "THAWED"
		}
	}
	return v
}

// auditKinds returns the kinds of sandbox sb's audit records, in order.
func (e *insideEnv) auditKinds(sb string) []string {
	e.t.Helper()
	p, err := e.m.AuditPath(sb)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		e.t.Fatal(err)
	}
	var kinds []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec struct {
			Kind string `json:"kind"`
		}
		json.Unmarshal([]byte(line), &rec)
		kinds = append(kinds, rec.Kind)
	}
	return kinds
}

func hasAll(have []string, want ...string) bool {
	set := map[string]bool{}
	for _, h := range have {
		set[h] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

// policy is a grant and a ceiling as tine serve --inside-grant
// memory=256M,cpus=1,pids=512 --inside-max memory=1G,cpus=2,pids=4096,disk=1G
// makes them.
var policy = api.InsideOptions{
	Grant:     sandbox.Limits{Pids: 512, LimitsExt: sandbox.LimitsExt{MemoryBytes: 256 << 20, CPUs: 1}},
	MaxLimits: sandbox.Limits{Pids: 4096, ProjectBytes: 1 << 30, LimitsExt: sandbox.LimitsExt{MemoryBytes: 1 << 30, CPUs: 2}},
}

// TestInsideResourcesGrantPendMax: from inside a running sandbox, a raise
// within the grant is applied at once (the cgroup files say so); one past
// it waits for a person without freezing the sandbox, and once approved
// is applied at once too; one past the ceiling is refused naming the
// field, the value and the ceiling. Each step is audited.
func TestInsideResourcesGrantPendMax(t *testing.T) {
	e := newInsideEnv(t, policy)
	lim := sandbox.Limits{Pids: 100, ProjectBytes: 64 << 20, LimitsExt: sandbox.LimitsExt{MemoryBytes: 128 << 20, CPUs: 0.5}}
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "grantlive", From: e.project, Limits: lim}); err != nil {
		t.Fatal(err)
	}
	if v := cgroupFile(t, "grantlive", "pids", "pids.max"); v != "100" {
		t.Fatalf("pids.max at start: %s", v)
	}
	st, body := e.call("grantlive", "GET", "/v1/self/limits", "")
	if st != 200 || !strings.Contains(body, `"grant":{"pids":512,"cpus":1,"memory_bytes":268435456}`) {
		t.Fatalf("limits: %d %s", st, body)
	}

	// Within the grant: at once, live.
	st, body = e.call("grantlive", "POST", "/v1/self/resources", `{"limits":{"memory_bytes":268435456,"cpus":1,"pids":512},"reason":"a bigger build"}`)
	if st != 200 || !strings.Contains(body, `"state":"granted"`) {
		t.Fatalf("raise within the grant: %d %s", st, body)
	}
	for _, c := range [][3]string{
		{"pids", "pids.max", "512"},
		{"memory", "memory.limit_in_bytes", "268435456"},
		{"cpu", "cpu.cfs_quota_us", "100000"},
	} {
		if v := cgroupFile(t, "grantlive", c[0], c[1]); v != c[2] {
			t.Errorf("%s after the grant: %s, want %s", c[1], v, c[2])
		}
	}
	// The sandbox sees it: 400 more processes than its old limit start.
	out := e.sh("grantlive", `i=0; while [ $i -lt 300 ]; do sleep 5 >/dev/null 2>&1 & i=$((i+1)); done; echo started; for p in $(jobs -p); do kill $p; done; true`)
	if !strings.Contains(out, "started") {
		t.Errorf("300 processes under the granted pids limit: %s", out)
	}

	// Past the grant: pending, nothing changes, the sandbox runs on.
	st, body = e.call("grantlive", "POST", "/v1/self/resources", `{"limits":{"pids":2048,"memory_bytes":536870912,"project_bytes":134217728}}`)
	var a api.Approval
	if st != 202 || json.Unmarshal([]byte(body), &a) != nil || a.State != "pending" || a.Kind != "resources" {
		t.Fatalf("raise past the grant: %d %s", st, body)
	}
	if v := cgroupFile(t, "grantlive", "pids", "pids.max"); v != "512" {
		t.Errorf("pids.max before approval: %s", v)
	}
	if why := e.m.Frozen("grantlive"); why != "" {
		t.Errorf("a pending raise froze the sandbox: %s", why)
	}
	if v := cgroupFile(t, "grantlive", "freezer", "freezer.state"); v != "THAWED" {
		t.Errorf("freezer state with a raise pending: %s", v)
	}
	if st, body := e.host("POST", "/v1/approvals/"+a.ID+"/approve", `{"message":"ok"}`); st != 200 || !strings.Contains(body, `"approved"`) {
		t.Fatalf("approve: %d %s", st, body)
	}
	if v := cgroupFile(t, "grantlive", "pids", "pids.max"); v != "2048" {
		t.Errorf("pids.max after approval: %s", v)
	}
	if v := cgroupFile(t, "grantlive", "memory", "memory.limit_in_bytes"); v != "536870912" {
		t.Errorf("memory limit after approval: %s", v)
	}
	st, body = e.call("grantlive", "GET", "/v1/self/limits", "")
	if st != 200 || !strings.Contains(body, `"project_bytes":134217728`) {
		t.Errorf("project bytes after approval: %d %s", st, body)
	}

	// Past the ceiling: refused, naming the field, the value and the ceiling.
	for _, c := range []struct{ body, field, asked, ceiling string }{
		{`{"limits":{"cpus":3}}`, "cpus", "3", "2"},
		{`{"limits":{"memory_bytes":1073741825}}`, "memory_bytes", "1073741825", "1073741824"},
		{`{"limits":{"pids":4097,"cpus":1}}`, "pids", "4097", "4096"},
		{`{"limits":{"project_bytes":2147483648}}`, "project_bytes", "2147483648", "1073741824"},
	} {
		st, body := e.call("grantlive", "POST", "/v1/self/resources", c.body)
		if st != 403 || !strings.Contains(body, c.field+" "+c.asked+": above the policy's ceiling of "+c.ceiling) {
			t.Errorf("%s: %d %s, want 403 naming %s %s and %s", c.body, st, body, c.field, c.asked, c.ceiling)
		}
	}
	if v := cgroupFile(t, "grantlive", "pids", "pids.max"); v != "2048" {
		t.Errorf("pids.max after refusals: %s", v)
	}
	// Not a resource a sandbox may ask for.
	if st, body := e.call("grantlive", "POST", "/v1/self/resources", `{"limits":{"gpu":true}}`); st != 400 {
		t.Errorf("gpu: %d %s", st, body)
	}
	if k := e.auditKinds("grantlive"); !hasAll(k, "resources-granted", "resources-pending", "resources-refused", "limits") {
		t.Errorf("audit kinds: %v", k)
	}
}

// TestInsideResourcesNoMax: a daemon without --inside-max refuses every
// raise and says how to allow them.
func TestInsideResourcesNoMax(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	e.create("nomax")
	for _, req := range []string{`{"limits":{"pids":10}}`, `{"limits":{"memory_bytes":67108864}}`, `{"limits":{"cpus":0.5}}`, `{"limits":{"project_bytes":1}}`} {
		st, body := e.call("nomax", "POST", "/v1/self/resources", req)
		if st != 403 || !strings.Contains(body, "tine serve --inside-max") {
			t.Errorf("%s: %d %s, want 403 with the hint", req, st, body)
		}
	}
	if len(e.in.Approvals("nomax")) != 0 {
		t.Errorf("refusals left approvals: %v", e.in.Approvals("nomax"))
	}
}

// TestInsideResourcesConcurrent: many raises asked at once from inside,
// all approved at once, and a fork's own: the limit ends at the highest
// level asked within the ceiling, never past it.
func TestInsideResourcesConcurrent(t *testing.T) {
	e := newInsideEnv(t, policy)
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "conc", From: e.project, Limits: sandbox.Limits{Pids: 100}}); err != nil {
		t.Fatal(err)
	}
	// 14 requests at once, a third within the grant; 5000 is past the ceiling.
	levels := []int{200, 300, 400, 512, 600, 900, 1200, 1500, 2000, 2500, 3000, 3500, 4096, 5000}
	var script strings.Builder
	for _, n := range levels {
		fmt.Fprintf(&script, "curl -sS -o /tmp/r%d -w '%%{http_code}\\n' --unix-socket %s -d '{\"limits\":{\"pids\":%d}}' http://tine/v1/self/resources > /tmp/c%d &\n", n, api.InsideSocket, n, n)
	}
	script.WriteString("wait\n")
	for _, n := range levels {
		fmt.Fprintf(&script, "echo %d $(cat /tmp/c%d)\n", n, n)
	}
	codes := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(e.sh("conc", script.String())), "\n") {
		var n int
		var c string
		fmt.Sscan(line, &n, &c)
		codes[n] = c
	}
	for _, n := range levels {
		want := map[bool]string{true: "200", false: "202"}[n <= 512]
		if n > 4096 {
			want = "403"
		}
		if codes[n] != want {
			t.Errorf("pids %d: %s, want %s", n, codes[n], want)
		}
	}
	if v := cgroupFile(t, "conc", "pids", "pids.max"); v != "512" {
		t.Errorf("pids.max after the grants: %s", v)
	}
	pending := e.in.Approvals("conc")
	if len(pending) != 9 {
		t.Fatalf("pending: %d, want 9", len(pending))
	}
	var wg sync.WaitGroup
	for _, a := range pending {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.in.Answer(context.Background(), a.ID, true, ""); err != nil {
				t.Errorf("approve %s: %v", a.ID, err)
			}
		}()
	}
	wg.Wait()
	if v := cgroupFile(t, "conc", "pids", "pids.max"); v != "4096" {
		t.Errorf("pids.max after approving all at once: %s, want 4096", v)
	}
	if info, _ := e.m.Get("conc"); info.Limits.Pids != 4096 {
		t.Errorf("saved pids: %d", info.Limits.Pids)
	}
	// A fork starts at its parent's limits and cannot go past the ceiling.
	if st, body := e.call("conc", "POST", "/v1/self/fork", `{"n":1}`); st != 201 {
		t.Fatalf("fork: %d %s", st, body)
	}
	if st, body := e.call("conc-1", "POST", "/v1/self/resources", `{"limits":{"pids":4097}}`); st != 403 {
		t.Errorf("fork asks past the ceiling: %d %s", st, body)
	}
	if st, body := e.call("conc-1", "POST", "/v1/self/resources", `{"limits":{"pids":4096}}`); st != 200 || strings.Contains(body, "raised") {
		t.Errorf("fork asks for what it has: %d %s", st, body)
	}
	if v := cgroupFile(t, "conc-1", "pids", "pids.max"); v != "4096" {
		t.Errorf("fork's pids.max: %s", v)
	}
}

// TestUpdateMemoryBelowUse: a memory limit under what a sandbox holds in
// memory that cannot be reclaimed (a tmpfs file, no swap) is refused
// with 409 naming the cause, and the old limit stays applied and saved.
func TestUpdateMemoryBelowUse(t *testing.T) {
	e := newInsideEnv(t, policy)
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "memuse", From: e.project, Limits: sandbox.Limits{LimitsExt: sandbox.LimitsExt{MemoryBytes: 256 << 20}}}); err != nil {
		t.Fatal(err)
	}
	e.sh("memuse", "head -c 67108864 /dev/zero > /dev/shm/held")
	if st, body := e.hostPut("/v1/sandboxes/memuse/limits", `{"memory_bytes":16777216}`); st != 409 || !strings.Contains(body, "below what the sandbox uses") || !strings.Contains(body, "16777216") {
		t.Fatalf("memory under use: %d %s, want 409 naming the cause", st, body)
	}
	if v := cgroupFile(t, "memuse", "memory", "memory.limit_in_bytes"); v != strconv.Itoa(256<<20) {
		t.Errorf("memory limit after the refusal: %s", v)
	}
	if info, _ := e.m.Get("memuse"); info.Limits.MemoryBytes != 256<<20 {
		t.Errorf("saved memory limit: %d", info.Limits.MemoryBytes)
	}
	// Once the file is gone, the same limit is taken.
	e.sh("memuse", "rm /dev/shm/held")
	if st, body := e.hostPut("/v1/sandboxes/memuse/limits", `{"memory_bytes":16777216}`); st != 200 {
		t.Fatalf("memory after freeing: %d %s", st, body)
	}
}

// hostPut sends a PUT to the daemon's own API.
func (e *insideEnv) hostPut(path, body string) (int, string) {
	return e.host("PUT", path, body)
}

// socket returns a client of sandbox sb's own API socket, from the host:
// the same socket code inside reaches, for questions asked while the
// sandbox is already frozen.
func (e *insideEnv) socket(sb string) *http.Client {
	p := filepath.Join(e.root, "sandboxes", sb, "api.sock")
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", p)
	}}}
}

// askFromHost asks a question on sandbox sb's socket and returns it.
func (e *insideEnv) askFromHost(sb, body string) api.Approval {
	e.t.Helper()
	resp, err := e.socket(sb).Post("http://tine/v1/self/approvals", "application/json", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var a api.Approval
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != 202 {
		e.t.Fatalf("ask: %d %v", resp.StatusCode, err)
	}
	return a
}

// poll reads approval id on sandbox sb's socket with ?wait=wait.
func (e *insideEnv) poll(sb, id, wait string) api.Approval {
	var a api.Approval
	resp, err := e.socket(sb).Get("http://tine/v1/self/approvals/" + id + "?wait=" + wait)
	if err != nil {
		return a
	}
	defer resp.Body.Close()
	json.NewDecoder(resp.Body).Decode(&a)
	return a
}

// ticker is a service writing the time every 50 ms.
const ticker = "while :; do date +%s%N >> /tmp/ticks; sleep 0.05; done"

// ticks returns the times the ticker wrote.
func (e *insideEnv) ticks(sb string) []time.Time {
	e.t.Helper()
	var out []time.Time
	// Before the first tick there is no file yet.
	for _, f := range strings.Fields(e.sh(sb, "cat /tmp/ticks 2>/dev/null || true")) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err == nil {
			out = append(out, time.Unix(0, n))
		}
	}
	return out
}

func countBetween(ts []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range ts {
		if t.After(from) && t.Before(to) {
			n++
		}
	}
	return n
}

// TestInsideQuestionFreezes: a question asked from inside freezes the
// whole sandbox (a loop writing the time every 50 ms writes nothing)
// until a person answers; then it resumes, and the asker reads the
// answer with a long poll.
func TestInsideQuestionFreezes(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "ask", From: e.project, Services: []string{ticker}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ticker", func() bool { return len(e.ticks("ask")) > 3 })
	done := make(chan string, 1)
	go func() {
		var out bytes.Buffer
		script := `id=$(curl -sS --unix-socket /run/tine/api.sock -d '{"reason":"ship it?"}' http://tine/v1/self/approvals | grep -o 'ap-[0-9a-f]*' | head -n1)
echo "asked $id"
curl -sS --unix-socket /run/tine/api.sock "http://tine/v1/self/approvals/$id?wait=60s"`
		e.c.Exec(context.Background(), "ask", shReq(script), client.ExecIO{Stdout: &out, Stderr: &out})
		done <- out.String()
	}()
	var q api.Approval
	waitFor(t, "the question", func() bool {
		for _, a := range e.in.Approvals("ask") {
			q = a
			return a.State == "pending" && e.m.Frozen("ask") != ""
		}
		return false
	})
	if v := cgroupFile(t, "ask", "freezer", "freezer.state"); v != "FROZEN" {
		t.Fatalf("freezer state with a question pending: %s", v)
	}
	// Commands wait too.
	if _, err := e.c.Exec(ctxT(t), "ask", shReq("true"), client.ExecIO{}); err == nil || !errors.Is(err, sandbox.ErrFrozen) && !strings.Contains(err.Error(), "frozen") {
		t.Errorf("exec while a question waits: %v", err)
	}
	t1 := time.Now()
	time.Sleep(time.Second)
	t2 := time.Now()
	if st, body := e.host("POST", "/v1/approvals/"+q.ID+"/approve", `{"message":"go"}`); st != 200 {
		t.Fatalf("approve: %d %s", st, body)
	}
	select {
	case out := <-done:
		if !strings.Contains(out, "asked "+q.ID) || !strings.Contains(out, `"state":"approved"`) || !strings.Contains(out, `"answer":"go"`) {
			t.Fatalf("the asker read: %s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the asker did not get the answer")
	}
	waitFor(t, "ticks after the answer", func() bool { return countBetween(e.ticks("ask"), t2, time.Now().Add(time.Hour)) >= 3 })
	ts := e.ticks("ask")
	if n := countBetween(ts, t1, t2); n != 0 {
		t.Errorf("%d ticks in the second the question waited, want none", n)
	}
	if e.m.Frozen("ask") != "" || cgroupFile(t, "ask", "freezer", "freezer.state") != "THAWED" {
		t.Errorf("still frozen after the answer: %q", e.m.Frozen("ask"))
	}
	if k := e.auditKinds("ask"); !hasAll(k, "question-asked", "question-answered", "freeze", "thaw") {
		t.Errorf("audit kinds: %v", k)
	}
}

// TestInsideTwoQuestions: with two questions pending, the sandbox thaws
// only once the last is answered.
func TestInsideTwoQuestions(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	e.create("two")
	a1 := e.askFromHost("two", `{"reason":"first?"}`)
	a2 := e.askFromHost("two", `{"reason":"second?"}`)
	if !a1.Frozen || !a2.Frozen {
		t.Fatalf("records: %+v %+v", a1, a2)
	}
	if v := cgroupFile(t, "two", "freezer", "freezer.state"); v != "FROZEN" {
		t.Fatalf("freezer with two questions: %s", v)
	}
	if _, err := e.in.Answer(ctxT(t), a2.ID, false, "no"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if v := cgroupFile(t, "two", "freezer", "freezer.state"); v != "FROZEN" || e.m.Frozen("two") == "" {
		t.Fatalf("thawed with a question still pending: %s", v)
	}
	// A long poll ends at its wait with the record still pending, or at
	// the answer.
	start := time.Now()
	if got := e.poll("two", a1.ID, "300ms"); got.State != "pending" || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("poll past its wait: %+v after %s", got, time.Since(start))
	}
	polled := make(chan api.Approval, 1)
	go func() { polled <- e.poll("two", a1.ID, "30s") }()
	time.Sleep(200 * time.Millisecond)
	if _, err := e.in.Answer(ctxT(t), a1.ID, true, "yes"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-polled:
		if got.State != "approved" || got.Answer != "yes" {
			t.Fatalf("long poll got %+v", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll did not end at the answer")
	}
	if v := cgroupFile(t, "two", "freezer", "freezer.state"); v != "THAWED" || e.m.Frozen("two") != "" {
		t.Fatalf("frozen after the last answer: %s", v)
	}
	if out := e.sh("two", "echo alive"); out != "alive\n" {
		t.Errorf("after the thaw: %q", out)
	}
	// A person's freeze outlasts a question's.
	if err := e.m.Freeze(ctxT(t), "two"); err != nil {
		t.Fatal(err)
	}
	a3 := e.askFromHost("two", `{"reason":"third?"}`)
	e.in.Answer(ctxT(t), a3.ID, true, "")
	if v := cgroupFile(t, "two", "freezer", "freezer.state"); v != "FROZEN" {
		t.Errorf("a person's freeze ended by an answer: %s", v)
	}
	if err := e.m.Thaw(ctxT(t), "two"); err != nil {
		t.Fatal(err)
	}
}

// TestInsideQuestionTimeout: a question no one answers within its
// timeout_s counts as denied and the sandbox thaws; the asker, waiting,
// reads the denial.
func TestInsideQuestionTimeout(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	e.create("late")
	start := time.Now()
	st, body := e.call("late", "POST", "/v1/self/approvals", `{"reason":"anyone?","timeout_s":1,"wait":true}`)
	if st != 200 || !strings.Contains(body, `"state":"denied"`) || !strings.Contains(body, `"timed_out":true`) {
		t.Fatalf("question with a timeout: %d %s", st, body)
	}
	if d := time.Since(start); d < time.Second || d > 15*time.Second {
		t.Errorf("answered after %s", d)
	}
	if v := cgroupFile(t, "late", "freezer", "freezer.state"); v != "THAWED" || e.m.Frozen("late") != "" {
		t.Errorf("frozen after the timeout: %s", v)
	}
	as := e.in.Approvals("late")
	sort.Slice(as, func(i, j int) bool { return as[i].Created.Before(as[j].Created) })
	if len(as) != 1 || as[0].Deadline == nil || !as[0].TimedOut {
		t.Errorf("record: %+v", as)
	}
	// Bounds.
	for _, b := range []string{`{"reason":"x","timeout_s":-1}`, `{"reason":"x","timeout_s":86401}`} {
		if st, body := e.call("late", "POST", "/v1/self/approvals", b); st != 400 {
			t.Errorf("%s: %d %s", b, st, body)
		}
	}
	if st, body := e.call("late", "GET", "/v1/self/approvals/"+as[0].ID+"?wait=11m", ""); st != 400 {
		t.Errorf("wait past the bound: %d %s", st, body)
	}
}
