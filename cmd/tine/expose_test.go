package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// httpGet fetches url from the host.
func httpGet(url string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return string(b), err
}

// TestExposeBrowser serves a web app in a sandbox (mode none, on the
// sandbox's loopback), exposes it with tine expose and loads it in
// headless Chromium: the page's script opens a WebSocket back through the
// exposure and shows the server's answer, and the server records what it
// got. tine ports lists the listener with its URL; --rm closes the
// exposure; --auto on exposes a listener started later.
func TestExposeBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is needed (make deps)")
	}
	c, proj := newSandboxCLI(t)
	app := filepath.Join(proj, "wsapp")
	build := exec.Command("go", "build", "-o", app, "tine/cmd/tine/testdata/wsapp")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build wsapp: %v\n%s", err, out)
	}
	c.ok("create", "--from", proj, "--name", "web", "--service", app+" -addr 127.0.0.1:8000")

	// Wait for the service to listen.
	var view portsView
	for deadline := time.Now().Add(30 * time.Second); ; {
		view = portsView{}
		json.Unmarshal([]byte(c.ok("ports", "web", "--json")), &view)
		if len(view.Listeners) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the app never listened: %+v", view)
		}
		time.Sleep(200 * time.Millisecond)
	}

	url := strings.TrimSpace(c.ok("expose", "web", "8000"))
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("expose printed %q, want a URL on 127.0.0.1", url)
	}
	if body, err := httpGet(url); err != nil || !strings.Contains(body, "new WebSocket") {
		t.Fatalf("GET %s: %v %.80q", url, err, body)
	}
	text := c.ok("ports", "web")
	if !strings.Contains(text, "8000") || !strings.Contains(text, url) {
		t.Errorf("ports does not show the exposure's URL:\n%s", text)
	}
	if _, errOut, code := c.run("", "expose", "web", "8000", "--host-port", "1"); code == 0 || !strings.Contains(errOut, "already exposed") {
		t.Errorf("exposing a port twice on another host port: exit %d, %s", code, errOut)
	}

	// A real browser runs the page's script, whose WebSocket goes through
	// the exposure.
	// The budget is of the page's virtual time, which runs ahead of the
	// real time the WebSocket's connection takes on a loaded host: a page
	// dumped before its socket answered is loaded again, with more.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var dom []byte
	for _, budget := range []string{"10000", "30000", "60000"} {
		cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
			"--user-data-dir="+t.TempDir(), "--virtual-time-budget="+budget, "--dump-dom", url)
		var err error
		if dom, err = cmd.Output(); err != nil {
			t.Fatalf("chromium: %v\n%s", err, dom)
		}
		if strings.Contains(string(dom), "ws pong:hello-from-browser") {
			break
		}
		t.Logf("no answer within a virtual-time budget of %s ms; loading the page again", budget)
	}
	if !strings.Contains(string(dom), "ws pong:hello-from-browser") {
		t.Errorf("the page's WebSocket did not answer; DOM:\n%s", dom)
	}
	if got := c.ok("exec", "web", "--", "cat", "/tmp/wsapp.result"); got != "hello-from-browser\n" {
		t.Errorf("the app received %q over the WebSocket", got)
	}

	// --rm closes it.
	c.ok("expose", "web", "8000", "--rm")
	if _, err := httpGet(url); err == nil {
		t.Errorf("GET %s after --rm succeeded", url)
	}

	// --auto on: a listener started later is exposed on its own.
	c.ok("expose", "web", "--auto", "on")
	c.ok("exec", "web", "--", "sh", "-c", "setsid "+app+" -addr 127.0.0.1:8124 -out /tmp/later </dev/null >/dev/null 2>&1 &")
	var auto string
	for deadline := time.Now().Add(30 * time.Second); auto == ""; {
		view = portsView{}
		json.Unmarshal([]byte(c.ok("ports", "web", "--json")), &view)
		for _, e := range view.Exposures {
			if e.Port == 8124 && e.Auto {
				auto = e.URL
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no auto exposure of port 8124: %+v", view)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !view.AutoExpose {
		t.Errorf("ports --json: auto_expose is false")
	}
	if body, err := httpGet(auto); err != nil || !strings.Contains(body, "new WebSocket") {
		t.Errorf("GET %s (auto): %v %.80q", auto, err, body)
	}

	// Stopping the sandbox closes its exposures.
	c.ok("stop", "web")
	if _, err := httpGet(auto); err == nil {
		t.Errorf("GET %s after stop succeeded", auto)
	}
}
