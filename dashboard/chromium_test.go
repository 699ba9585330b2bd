package dashboard_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"tine/api"
	"tine/api/client"
	"tine/cowfs"
	"tine/dashboard"
	"tine/execpolicy"
	"tine/guestagent/proto"
	"tine/internal/testagent"
	"tine/sandbox"
	"tine/sandbox/ns"
)

var agentPath string

func TestMain(m *testing.M) {
	testagent.Main(m, &agentPath)
}

// daemon serves a manager over a fresh store; it returns the API handler
// and a client of it.
func daemon(t *testing.T) (*api.Server, *client.Client) {
	base := t.TempDir()
	fs, err := cowfs.Open(filepath.Join(base, "cowfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := ns.New(agentPath)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "state")
	m, err := sandbox.Open(context.Background(), root, fs, sandbox.Options{Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := api.Listen(root, "")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewServer(m, api.ServerOptions{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
		m.Close(context.Background())
		fs.Close()
	})
	return srv, client.New(filepath.Join(root, api.SocketName))
}

// webDriver speaks the W3C WebDriver protocol to chromedriver.
type webDriver struct {
	t       *testing.T
	base    string
	session string
}

const elementKey = "element-6066-11e4-a52e-4f735466cecf"

func (d *webDriver) call(method, path string, in any) json.RawMessage {
	d.t.Helper()
	v, err := d.try(method, path, in)
	if err != nil {
		d.t.Fatal(err)
	}
	return v
}

// try is call returning the error.
func (d *webDriver) try(method, path string, in any) (json.RawMessage, error) {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, d.base+path, body)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("webdriver %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out struct{ Value json.RawMessage }
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 {
		return nil, fmt.Errorf("webdriver %s %s: %s: %s", method, path, resp.Status, b)
	}
	return out.Value, nil
}

// find waits up to 20 s for an element matching css and returns its id.
func (d *webDriver) find(css string) string {
	d.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v := d.call("POST", "/session/"+d.session+"/elements", map[string]string{"using": "css selector", "value": css})
		var els []map[string]string
		json.Unmarshal(v, &els)
		if len(els) > 0 {
			return els[0][elementKey]
		}
		if time.Now().After(deadline) {
			d.screenshot("timeout")
			d.t.Fatalf("no element %q on the page after 20 s", css)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gone waits up to 20 s until no element matches css.
func (d *webDriver) gone(css string) {
	d.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v := d.call("POST", "/session/"+d.session+"/elements", map[string]string{"using": "css selector", "value": css})
		var els []map[string]string
		json.Unmarshal(v, &els)
		if len(els) == 0 {
			return
		}
		if time.Now().After(deadline) {
			d.screenshot("timeout")
			d.t.Fatalf("element %q still on the page after 20 s", css)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitText waits up to 20 s until the text of the element matching css
// satisfies ok (the page redraws at each poll), and returns it.
func (d *webDriver) waitText(css string, ok func(string) bool) string {
	d.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := d.text(css)
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			d.screenshot("timeout")
			d.t.Fatalf("%s shows %q after 20 s", css, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fig is the selector of a tree node's live usage figure (memory, cpu,
// pids, project).
func fig(sb, key string) string {
	return fmt.Sprintf(`li[data-sandbox=%q] > .node .fig[data-usage=%q]`, sb, key)
}

// click clicks the element matching css, finding it again when the
// page's poll replaced it between the find and the click.
func (d *webDriver) click(css string) {
	d.t.Helper()
	for i := 0; ; i++ {
		_, err := d.try("POST", "/session/"+d.session+"/element/"+d.find(css)+"/click", map[string]any{})
		if err == nil {
			return
		}
		if i >= 5 || !strings.Contains(err.Error(), "stale element") {
			d.t.Fatal(err)
		}
	}
}

func (d *webDriver) typeIn(css, text string) {
	d.call("POST", "/session/"+d.session+"/element/"+d.find(css)+"/value", map[string]any{"text": text})
}

func (d *webDriver) text(css string) string {
	d.t.Helper()
	for i := 0; ; i++ {
		v, err := d.try("GET", "/session/"+d.session+"/element/"+d.find(css)+"/text", nil)
		if err == nil {
			var s string
			json.Unmarshal(v, &s)
			return s
		}
		if i >= 5 || !strings.Contains(err.Error(), "stale element") {
			d.t.Fatal(err)
		}
	}
}

// screenshot saves the page as NAME.png in the test's artifact directory.
func (d *webDriver) screenshot(name string) {
	var b64 string
	json.Unmarshal(d.call("GET", "/session/"+d.session+"/screenshot", nil), &b64)
	png, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		d.t.Fatalf("screenshot %s: not a PNG (%v)", name, err)
	}
	p := filepath.Join(d.t.ArtifactDir(), name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		d.t.Fatal(err)
	}
	d.t.Logf("screenshot %s (%d bytes)", p, len(png))
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestDashboardInChromium drives the page in Debian's headless Chromium
// through chromedriver: create a sandbox, see it in the tree, fork it from
// its panel, see the fork appear under it, show the promote plan, with a
// screenshot at each step.
func TestDashboardInChromium(t *testing.T) {
	driver, err := exec.LookPath("chromedriver")
	if err != nil {
		t.Fatalf("chromedriver is not installed (Debian's chromium-driver): run \"make deps\": %v", err)
	}
	srv, c := daemon(t)
	const token = "dash-token"
	web := httptest.NewServer(dashboard.Handler(srv, token))
	defer web.Close()
	proj := filepath.Join(t.TempDir(), "proj")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "a.txt"), []byte("a\n"), 0o644)

	// Without the token: nothing, neither the page nor the API.
	for _, p := range []string{"/ui/", "/v1/sandboxes"} {
		resp, err := http.Get(web.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s without token: %d", p, resp.StatusCode)
		}
	}

	port := freePort(t)
	cd := exec.Command(driver, fmt.Sprintf("--port=%d", port))
	cd.Stdout, cd.Stderr = io.Discard, io.Discard
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cd.Process.Kill(); cd.Wait() }()
	d := &webDriver{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	for i := 0; ; i++ {
		resp, err := http.Get(d.base + "/status")
		if err == nil {
			resp.Body.Close()
			break
		}
		if i > 100 {
			t.Fatalf("chromedriver does not answer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	browser := "/usr/bin/chromium"
	v := d.call("POST", "/session", map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"goog:chromeOptions": map[string]any{"binary": browser,
			"args": []string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"}},
	}}})
	var sess struct{ SessionID string }
	json.Unmarshal(v, &sess)
	d.session = sess.SessionID
	defer d.call("DELETE", "/session/"+d.session, nil)

	d.call("POST", "/session/"+d.session+"/url", map[string]string{"url": web.URL + "/?token=" + token})
	d.find("#empty:not([hidden])")
	d.screenshot("1-empty")

	d.typeIn("#create-from", proj)
	d.typeIn("#create-name", "web")
	d.click("#create-btn")
	d.find(`li[data-sandbox="web"] .state.running`)
	d.find("#detail:not([hidden])")
	if got := d.text("#d-name"); got != "web" {
		t.Errorf("detail shows %q", got)
	}
	d.screenshot("2-created")

	// Live usage (GET /v1/usage) beside each node: memory, CPU from the
	// second poll on, pids and project bytes; the detail pane's table too.
	d.waitText(fig("web", "pids"), func(s string) bool {
		n, err := strconv.Atoi(strings.TrimPrefix(s, "pids "))
		return err == nil && n > 0
	})
	d.waitText(fig("web", "memory"), func(s string) bool { return strings.HasPrefix(s, "mem ") && !strings.HasPrefix(s, "mem 0 B") })
	d.waitText(fig("web", "cpu"), func(s string) bool { return strings.HasPrefix(s, "cpu ") && strings.HasSuffix(s, "%") })
	d.waitText(fig("web", "project"), func(s string) bool { return strings.HasPrefix(s, "disk ") })
	d.waitText(`#usage tr[data-usage="pids"] td.limit`, func(s string) bool { return s == "no limit" })
	d.find(`#usage tr[data-usage="memory"]:not(.near)`)

	d.click("#b-fork")
	d.find(`li[data-sandbox="web"] ul li[data-sandbox="web-1"] .state.running`)
	d.screenshot("3-forked")
	list, err := c.List(t.Context())
	if err != nil || len(list) != 2 || list[1].ForkedFrom != "web" {
		t.Errorf("after the fork button: %+v %v", list, err)
	}

	// A change in the fork shows in its diff; promote shows the plan first.
	if err := c.PutFile(t.Context(), "web-1", filepath.Join(proj, "new.txt"), 0o644, strings.NewReader("new\n")); err != nil {
		t.Fatal(err)
	}
	d.click(`li[data-sandbox="web-1"] > .node`)
	d.find(`#diff li.kind-added`)
	d.click("#b-promote")
	d.find("#plan:not([hidden])")
	if got := d.text("#plan-list"); !strings.Contains(got, "new.txt") {
		t.Errorf("plan shows %q", got)
	}
	d.screenshot("4-promote-plan")
	if _, err := os.Stat(filepath.Join(proj, "new.txt")); err == nil {
		t.Errorf("showing the plan wrote the host")
	}
	d.click("#b-apply")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(proj, "new.txt")); err == nil && string(b) == "new\n" {
			break
		}
		if time.Now().After(deadline) {
			d.screenshot("5-apply-timeout")
			t.Fatalf("apply did not promote new.txt")
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.screenshot("5-promoted")

	// Freeze, then thaw, from the panel: the state shows, and the daemon
	// agrees; the audit log, polled, shows both.
	// The tree marks the node with why it is frozen, and still shows its
	// usage (read from its cgroups: its agent cannot answer).
	frozenBadge := `li[data-sandbox="web-1"] > .node .badge.frozen`
	d.click("#b-freeze")
	d.find(`#detail[data-frozen="yes"] #d-frozen:not([hidden])`)
	if l, err := c.Limits(t.Context(), "web-1"); err != nil || l.Frozen == "" {
		t.Errorf("after the freeze button: %+v %v", l, err)
	}
	if got := d.waitText(frozenBadge, func(s string) bool { return s != "" }); got != "frozen: by hand" {
		t.Errorf("tree badge %q, want frozen: by hand", got)
	}
	if got := d.text("#d-frozen"); got != "frozen by a person" {
		t.Errorf("detail pane says %q", got)
	}
	d.find(`li[data-sandbox="web-1"] > .node:has(.badge.frozen) .fig[data-usage="pids"]`)
	d.gone(`li[data-sandbox="web"] > .node .badge.frozen`)
	d.screenshot("6-frozen")
	d.click("#b-thaw")
	d.find(`#detail[data-frozen="no"] #d-frozen[hidden]`)
	d.gone(frozenBadge)
	if l, err := c.Limits(t.Context(), "web-1"); err != nil || l.Frozen != "" {
		t.Errorf("after the thaw button: %+v %v", l, err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if a := d.text("#audit"); strings.Contains(a, " freeze ") && strings.Contains(a, " thaw ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit log pane: %q", d.text("#audit"))
		}
	}
	// An exposed port is a link.
	ex, err := c.Expose(t.Context(), "web-1", api.ExposeRequest{Port: 8000})
	if err != nil {
		t.Fatal(err)
	}
	d.find(fmt.Sprintf(`#exposures a[href^=%q]`, ex.URL))
	d.screenshot("7-thawed-exposed")

	// A command the exec policy holds for a person: approved from the
	// panel, it runs; denied, it does not.
	// The tree and the detail pane count what waits; the second command's
	// policy freezes the sandbox while it waits, and the badge says why.
	for _, answer := range []string{"approve", "deny"} {
		freeze := answer == "deny"
		if _, err := c.SetExecPolicy(t.Context(), "web-1", &execpolicy.Policy{FreezeOnAsk: freeze, Rules: []execpolicy.Rule{{Pattern: "touch *", Action: execpolicy.Ask}}}); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(proj, answer+".txt")
		done := make(chan error, 1)
		go func() {
			_, err := c.Exec(context.WithoutCancel(t.Context()), "web-1", api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"touch", target}}}, client.ExecIO{})
			done <- err
		}()
		d.find(`#approvals-pane:not([hidden]) #approvals li[data-approval]`)
		// The pane polls: the answered request before this one may
		// still be shown for a moment.
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(d.text("#approvals"), "touch "+target); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("approvals pane shows %q, want the request to touch %s", d.text("#approvals"), target)
			}
		}
		one := func(s string) bool { return s == "1 waiting" }
		d.waitText(`li[data-sandbox="web-1"] > .node .badge.waiting`, one)
		d.waitText("#d-waiting", one)
		if freeze {
			d.waitText(frozenBadge, func(s string) bool { return s == "frozen: approval" })
			d.waitText("#d-frozen", func(s string) bool { return strings.HasPrefix(s, "frozen: waiting for approval ap-") })
		} else {
			d.gone(frozenBadge)
		}
		d.screenshot("8-" + answer)
		d.click("#approvals button." + answer)
		select {
		case err := <-done:
			if (err == nil) != (answer == "approve") {
				t.Errorf("%s: exec returned %v", answer, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the command still waits", answer)
		}
		var out strings.Builder
		c.Exec(t.Context(), "web-1", api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"sh", "-c", "test -e " + target + " && echo yes || echo no"}}}, client.ExecIO{Stdout: &out})
		if want := map[string]string{"approve": "yes\n", "deny": "no\n"}[answer]; out.String() != want {
			t.Errorf("%s: the file exists? %q", answer, out.String())
		}
	}
	d.find(`#approvals-pane[hidden]`)
	d.gone(`li[data-sandbox="web-1"] > .node .badge.waiting`)
	d.gone(frozenBadge)
	d.find(`#d-waiting[hidden]`)

	// A figure near its limit is red: a few sleeps in web and a pids
	// limit they fill to more than 90%; without the limit it is not red.
	if _, err := c.Exec(t.Context(), "web", api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"sh", "-c",
		"for i in $(seq 25); do sleep 1000 </dev/null >/dev/null 2>&1 & done"}}}, client.ExecIO{}); err != nil {
		t.Fatal(err)
	}
	u, err := c.Usage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var pids int64
	for _, s := range u.Sandboxes {
		if s.Name == "web" && s.Usage != nil {
			pids = int64(s.Usage.Pids)
		}
	}
	if pids < 25 {
		t.Fatalf("web runs %d pids after 25 sleeps: %+v", pids, u)
	}
	d.waitText(fig("web", "pids"), func(s string) bool {
		n, err := strconv.Atoi(strings.TrimPrefix(s, "pids "))
		return err == nil && n >= 25
	})
	d.find(fig("web", "pids") + ":not(.near)")
	limit := pids * 10 / 9 // pids/limit >= 0.9, with room for a few more
	if _, err := c.UpdateLimits(t.Context(), "web", sandbox.Limits{Pids: limit}); err != nil {
		t.Fatal(err)
	}
	d.find(fig("web", "pids") + ".near")
	if got := d.text(fig("web", "pids")); !strings.HasSuffix(got, fmt.Sprintf("/%d", limit)) {
		t.Errorf("pids figure %q, want it out of %d", got, limit)
	}
	d.find(fig("web", "memory") + ":not(.near)")
	d.click(`li[data-sandbox="web"] > .node`)
	d.find(`#usage tr.near[data-usage="pids"]`)
	d.find(`#usage tr[data-usage="memory"]:not(.near)`)
	// The OS layer, measured every few seconds while the sandbox uses
	// CPU, beside the default bound; in the tree only when near it.
	d.waitText(`#usage tr[data-usage="layer"] td.limit`, func(s string) bool { return s == "of 10.0 GiB" })
	d.find(fig("web", "pids") + ".near")
	d.gone(fig("web", "layer"))
	d.screenshot("9-near-limit")
	if _, err := c.UpdateLimits(t.Context(), "web", sandbox.Limits{}); err != nil {
		t.Fatal(err)
	}
	d.gone(fig("web", "pids") + ".near")
	d.gone(`#usage tr.near`)
}
