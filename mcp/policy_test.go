package mcp_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"tine/mcp"
)

// TestPolicyTools: expose a port and fetch through it, freeze and thaw,
// read and change the network policy and the limits, and read what was
// done in the sandbox's audit log resource. Another session can do none
// of it.
func TestPolicyTools(t *testing.T) {
	e := newEnv(t)
	cs := e.session(mcp.Options{}, nil)
	other := e.session(mcp.Options{}, nil)
	call(t, cs, tool("create", map[string]any{"from": e.project, "name": "p",
		"limits": map[string]any{"memory_bytes": 300 << 20}, "network": map[string]any{"allow": []string{"example.org"}},
		"services": []string{"cd " + e.project + " && exec python3 -m http.server 8765 --bind 0.0.0.0"}}), nil)

	var ex mcp.ExposeOut
	call(t, cs, tool("expose", map[string]any{"sandbox": "p", "port": 8765}), &ex)
	if ex.Port != 8765 || ex.HostPort == 0 || !strings.HasPrefix(ex.URL, "http://") {
		t.Fatalf("expose: %+v", ex)
	}
	var body string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get(ex.URL + "/main.txt")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if body = string(b); resp.StatusCode == 200 {
				break
			}
		}
	}
	if body != "v1\n" {
		t.Errorf("GET %s/main.txt: %q", ex.URL, body)
	}

	var fr mcp.FreezeOut
	call(t, cs, tool("freeze", map[string]any{"sandbox": "p"}), &fr)
	if !fr.Frozen || fr.Reason == "" {
		t.Errorf("freeze: %+v", fr)
	}
	var lim mcp.LimitsOut
	call(t, cs, tool("limits", map[string]any{"sandbox": "p"}), &lim)
	if lim.Frozen == "" || lim.MemoryBytes != 300<<20 {
		t.Errorf("limits of a frozen sandbox created with 300 MiB: %+v", lim)
	}
	call(t, cs, tool("thaw", map[string]any{"sandbox": "p"}), &fr)
	if fr.Frozen {
		t.Errorf("thaw: %+v", fr)
	}
	var out mcp.ExecOut
	call(t, cs, tool("exec", map[string]any{"sandbox": "p", "command": "echo alive"}), &out)
	if out.Stdout != "alive\n" {
		t.Errorf("exec after thaw: %+v", out)
	}

	var net mcp.NetworkOut
	call(t, cs, tool("network", map[string]any{"sandbox": "p"}), &net)
	if net.Mode != "allow" || len(net.Allow) != 1 || net.Allow[0] != "example.org" {
		t.Errorf("network: %+v", net)
	}
	call(t, cs, tool("set_network", map[string]any{"sandbox": "p", "mode": "allow", "allow": []string{"example.com"}}), &net)
	if net.Mode != "allow" || len(net.Allow) != 1 || net.Allow[0] != "example.com" {
		t.Errorf("set_network: %+v", net)
	}
	if msg := callFails(t, cs, tool("set_network", map[string]any{"sandbox": "p", "mode": "sideways"})); !strings.Contains(msg, "mode") {
		t.Errorf("set_network with a bad mode: %q", msg)
	}

	call(t, cs, tool("update_limits", map[string]any{"sandbox": "p", "pids": 77, "memory_bytes": 256 << 20}), &lim)
	if lim.Pids != 77 || lim.MemoryBytes != 256<<20 {
		t.Errorf("update_limits: %+v", lim)
	}
	call(t, cs, tool("update_limits", map[string]any{"sandbox": "p", "cpus": 0.5}), &lim)
	if lim.Pids != 77 || lim.CPUs != 0.5 {
		t.Errorf("update_limits of cpus alone changed the others: %+v", lim)
	}

	res, err := cs.ReadResource(ctxT(t), &sdk.ReadResourceParams{URI: "tine://sandboxes/p/audit"})
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, line := range strings.Split(strings.TrimSpace(res.Contents[0].Text), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		b, _ := json.Marshal(rec)
		ops = append(ops, string(b))
	}
	joined := strings.Join(ops, "\n")
	for _, want := range []string{"expose", "freeze", "thaw", "limits"} {
		if !strings.Contains(joined, `"`+want+`"`) {
			t.Errorf("audit resource lacks %s:\n%s", want, joined)
		}
	}

	for _, tl := range []string{"expose", "freeze", "thaw", "network", "set_network", "limits", "update_limits"} {
		args := map[string]any{"sandbox": "p"}
		if tl == "expose" {
			args["port"] = 8765
		}
		if msg := callFails(t, other, tool(tl, args)); !strings.Contains(msg, "not found among this session's sandboxes") {
			t.Errorf("other session %s: %q", tl, msg)
		}
	}
	if _, err := other.ReadResource(ctxT(t), &sdk.ReadResourceParams{URI: "tine://sandboxes/p/audit"}); err == nil {
		t.Errorf("other session read the audit log")
	}
}
