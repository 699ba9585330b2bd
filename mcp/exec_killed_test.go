package mcp_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"tine/api"
	"tine/mcp"
	"tine/sandbox"
)

// TestExecKilled: the exec tool's result says a command was killed by
// the sandbox's memory limit, and by its sandbox's removal under it.
func TestExecKilled(t *testing.T) {
	e := newEnv(t)
	lim := sandbox.Limits{LimitsExt: sandbox.LimitsExt{MemoryBytes: 64 << 20}}
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "m", From: e.project, Limits: lim}); err != nil {
		t.Fatal(err)
	}
	cs := e.session(mcp.Options{All: true}, nil)
	var out mcp.ExecOut
	call(t, cs, tool("exec", map[string]any{"sandbox": "m", "command": `x=$(head -c 150000000 /dev/zero | tr '\0' a); echo ${#x}`}), &out)
	if out.ExitCode != -1 || out.Signal != 9 || out.KilledBy != "oom" || out.KilledReason != "out of memory (memory limit 64 MiB)" {
		t.Errorf("hog over 64 MiB: %+v, want signal 9, killed_by oom", out)
	}
	type result struct {
		res *sdk.CallToolResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := cs.CallTool(ctxT(t), tool("exec", map[string]any{"sandbox": "m", "command": "exec sleep 60"}))
		done <- result{res, err}
	}()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ps mcp.PsOut
		call(t, cs, tool("ps", map[string]any{"sandbox": "m"}), &ps)
		if slices.ContainsFunc(ps.Processes, func(p mcp.Process) bool { return len(p.Argv) > 0 && p.Argv[0] == "sleep" }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sleep did not start")
		}
	}
	if err := e.c.Remove(ctxT(t), "m"); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.IsError {
		t.Fatalf("exec of a sleep in a sandbox removed under it: %v %+v", r.err, r.res)
	}
	b, _ := json.Marshal(r.res.StructuredContent)
	out = mcp.ExecOut{}
	if err := json.Unmarshal(b, &out); err != nil || out.ExitCode != -1 || out.Signal != 9 || out.KilledBy != "removed" {
		t.Errorf("sleep in a sandbox removed under it: %s (%v), want signal 9, killed_by removed", b, err)
	}
}
