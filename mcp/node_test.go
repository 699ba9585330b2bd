package mcp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/mcp"
)

// TestNodeClient: the TypeScript SDK's client (from the npm registry,
// installed by "make deps" into testdata/node) drives fork -> test ->
// promote over streamable HTTP with a bearer token.
func TestNodeClient(t *testing.T) {
	dir, _ := filepath.Abs("testdata/node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the MCP TypeScript SDK is not installed in %s: run \"make deps\" (npm ci there): %v", dir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed: run \"make deps\": %v", err)
	}
	e := newEnv(t)
	const token = "s3cret-token"
	srv := httptest.NewServer(mcp.Handler(mcp.Options{Client: e.c}, token))
	defer srv.Close()

	// Without the token: refused.
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: status %d, want 401", resp.StatusCode)
	}

	cmd := exec.CommandContext(ctxT(t), node, "drive.mjs", srv.URL, token, e.project)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node drive.mjs: %v\n%s", err, stderr.String())
	}
	var got struct {
		Tools    []string
		Forks    []string
		Winner   string
		Plan     mcp.PromoteOut
		Applied  bool
		Progress []string
		Listed   []string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	t.Logf("node client saw: %s", out)
	if len(got.Tools) < 12 || len(got.Forks) != 2 || got.Winner != got.Forks[1] {
		t.Errorf("tools %v, forks %v, winner %q", got.Tools, got.Forks, got.Winner)
	}
	if len(got.Plan.Changes) != 1 || got.Plan.Changes[0].Path != "result.txt" || got.Plan.Applied || !got.Applied {
		t.Errorf("plan %+v, applied %v", got.Plan, got.Applied)
	}
	if !strings.Contains(strings.Join(got.Progress, ""), "setup-done") {
		t.Errorf("progress notifications %q lack the command's output", got.Progress)
	}
	if len(got.Listed) != 3 {
		t.Errorf("list: %v, want the base and its 2 forks", got.Listed)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "result.txt")); string(b) != "pass\n" {
		t.Errorf("host result.txt after promote: %q", b)
	}
}
