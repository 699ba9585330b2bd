package mcp_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"tine/api"
	"tine/mcp"
)

// call calls a tool that must succeed and decodes its structured result.
func call(t *testing.T, cs *sdk.ClientSession, params *sdk.CallToolParams, out any) {
	t.Helper()
	res, err := cs.CallTool(ctxT(t), params)
	if err != nil {
		t.Fatalf("%s: %v", params.Name, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %s", params.Name, text(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: decode %s: %v", params.Name, b, err)
		}
	}
}

// callFails calls a tool that must fail and returns its message.
func callFails(t *testing.T, cs *sdk.ClientSession, params *sdk.CallToolParams) string {
	t.Helper()
	res, err := cs.CallTool(ctxT(t), params)
	if err != nil {
		return err.Error()
	}
	if !res.IsError {
		t.Fatalf("%s succeeded; want an error", params.Name)
	}
	return text(res)
}

func text(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func tool(name string, args map[string]any) *sdk.CallToolParams {
	return &sdk.CallToolParams{Name: name, Arguments: args}
}

// TestToolsList checks every tool is there with an object input schema
// and an output schema.
func TestToolsList(t *testing.T) {
	e := newEnv(t)
	cs := e.session(mcp.Options{}, nil)
	res, err := cs.ListTools(ctxT(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		if tl.InputSchema == nil || tl.OutputSchema == nil || tl.Description == "" {
			t.Errorf("tool %s: input schema %v, output schema %v, description %q", tl.Name, tl.InputSchema != nil, tl.OutputSchema != nil, tl.Description)
		}
	}
	for _, want := range []string{"create", "list", "status", "exec", "fork", "snapshot", "rollback", "diff", "promote", "ps", "ports", "rm",
		"expose", "freeze", "thaw", "network", "set_network", "limits", "update_limits", "read_file", "write_file"} {
		if !slices.Contains(names, want) {
			t.Errorf("no tool %s among %v", want, names)
		}
	}
	// The schema is enforced: exec without its sandbox is refused before
	// it reaches the daemon.
	if msg := callFails(t, cs, tool("exec", map[string]any{"command": "true"})); !strings.Contains(msg, "sandbox") {
		t.Errorf("exec without sandbox: %q does not name the missing argument", msg)
	}
}

// TestForkTestPromote drives a whole session with the SDK's client:
// create, exec with streamed output, snapshot, rollback, fork, test in each
// fork, diff, promote the one that passes.
func TestForkTestPromote(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var progress []string
	cs := e.session(mcp.Options{}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			progress = append(progress, req.Params.Message)
		},
	})
	var created struct{ Sandbox mcp.Sandbox }
	call(t, cs, tool("create", map[string]any{"from": e.project, "name": "base"}), &created)
	if created.Sandbox.Name != "base" || created.Sandbox.ProjectPath != e.project {
		t.Fatalf("create: %+v", created.Sandbox)
	}

	// exec streams its output as progress notifications.
	params := tool("exec", map[string]any{"sandbox": "base", "command": "for i in 1 2 3; do echo line$i; sleep 0.05; done; echo oops >&2; cat main.txt"})
	params.SetProgressToken("exec-1")
	var ex mcp.ExecOut
	call(t, cs, params, &ex)
	if ex.ExitCode != 0 || ex.Stdout != "line1\nline2\nline3\nv1\n" || ex.Stderr != "oops\n" {
		t.Fatalf("exec: %+v", ex)
	}
	// The client handles notifications apart from the call's result, so
	// the last may be handled just after it.
	var streamed string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		streamed = strings.Join(progress, "")
		mu.Unlock()
		if strings.Contains(streamed, "v1") || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range []string{"line1", "line3", "oops", "v1"} {
		if !strings.Contains(streamed, want) {
			t.Errorf("progress notifications %q lack %q", streamed, want)
		}
	}
	call(t, cs, tool("exec", map[string]any{"sandbox": "base", "argv": []string{"sh", "-c", "exit 3"}}), &ex)
	if ex.ExitCode != 3 {
		t.Errorf("exit 3: got %+v", ex)
	}
	// A command that cannot start is a result, as in a shell.
	ex = mcp.ExecOut{}
	call(t, cs, tool("exec", map[string]any{"sandbox": "base", "argv": []string{"nosuchcmd"}}), &ex)
	if ex.ExitCode != 127 || !strings.Contains(ex.Stderr, "nosuchcmd: command not found") {
		t.Errorf("nosuchcmd: got %+v", ex)
	}

	// snapshot, break it, roll back.
	var snap mcp.SnapshotOut
	call(t, cs, tool("snapshot", map[string]any{"sandbox": "base", "label": "clean"}), &snap)
	if snap.ID == "" || snap.Label != "clean" {
		t.Fatalf("snapshot: %+v", snap)
	}
	call(t, cs, tool("exec", map[string]any{"sandbox": "base", "command": "rm main.txt"}), &ex)
	call(t, cs, tool("rollback", map[string]any{"sandbox": "base", "snapshot": "clean"}), nil)
	call(t, cs, tool("exec", map[string]any{"sandbox": "base", "command": "cat main.txt"}), &ex)
	if ex.Stdout != "v1\n" {
		t.Fatalf("after rollback main.txt reads %q", ex.Stdout)
	}

	// fork 3 ways, one idea each; the test is "grep -q good".
	var forks mcp.ListOut
	call(t, cs, tool("fork", map[string]any{"sandbox": "base", "names": []string{"try-a", "try-b", "try-c"}}), &forks)
	if len(forks.Sandboxes) != 3 {
		t.Fatalf("fork: %+v", forks)
	}
	ideas := map[string]string{"try-a": "bad", "try-b": "good", "try-c": "worse"}
	winner := ""
	for _, f := range forks.Sandboxes {
		call(t, cs, tool("exec", map[string]any{"sandbox": f.Name, "command": "echo " + ideas[f.Name] + " > main.txt && grep -qx good main.txt"}), &ex)
		if ex.ExitCode == 0 {
			winner = f.Name
		}
	}
	if winner != "try-b" {
		t.Fatalf("winner %q, want try-b", winner)
	}
	var diff mcp.DiffOut
	call(t, cs, tool("diff", map[string]any{"sandbox": winner}), &diff)
	if len(diff.Changes) != 1 || diff.Changes[0].Path != "main.txt" || diff.Changes[0].Kind != "modified" || diff.Total != 1 || diff.Truncated {
		t.Fatalf("diff: %+v", diff)
	}
	// A limit lists the first changes and says how many there are.
	call(t, cs, tool("exec", map[string]any{"sandbox": "try-a", "command": "touch x y"}), &ex)
	call(t, cs, tool("diff", map[string]any{"sandbox": "try-a", "limit": 2}), &diff)
	if len(diff.Changes) != 2 || diff.Changes[0].Path != "main.txt" || diff.Changes[1].Path != "x" || diff.Total != 3 || !diff.Truncated {
		t.Fatalf("diff with limit 2 of 3 changes: %+v", diff)
	}
	var plan mcp.PromoteOut
	call(t, cs, tool("promote", map[string]any{"sandbox": winner, "dry_run": true}), &plan)
	if plan.Applied || len(plan.Changes) != 1 {
		t.Fatalf("dry run: %+v", plan)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "main.txt")); string(b) != "v1\n" {
		t.Fatalf("dry run wrote the host: %q", b)
	}
	call(t, cs, tool("promote", map[string]any{"sandbox": winner}), &plan)
	if !plan.Applied {
		t.Fatalf("promote: %+v", plan)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "main.txt")); string(b) != "good\n" {
		t.Fatalf("host main.txt after promote: %q", b)
	}

	// ps and ports of a sandbox running a listener.
	call(t, cs, tool("exec", map[string]any{"sandbox": "try-a", "command": "busybox nc -l -p 8123 </dev/null >/dev/null 2>&1 & sleep 0.3; echo started"}), &ex)
	var ps mcp.PsOut
	call(t, cs, tool("ps", map[string]any{"sandbox": "try-a"}), &ps)
	if len(ps.Processes) == 0 {
		t.Errorf("ps: no processes")
	}
	var ports mcp.PortsOut
	call(t, cs, tool("ports", map[string]any{"sandbox": "try-a"}), &ports)
	_ = ports // whether busybox nc is there depends on the host; ps is the assertion

	var list mcp.ListOut
	call(t, cs, tool("list", nil), &list)
	if len(list.Sandboxes) != 4 {
		t.Errorf("list: %d sandboxes, want 4: %+v", len(list.Sandboxes), list.Sandboxes)
	}
	for _, n := range []string{"try-a", "try-c"} {
		call(t, cs, tool("rm", map[string]any{"sandbox": n}), nil)
	}
	if _, err := e.c.Get(ctxT(t), "try-a"); err == nil {
		t.Errorf("try-a still there after rm")
	}
}

// TestScope: a session sees only what it created and forks of it.
func TestScope(t *testing.T) {
	e := newEnv(t)
	a := e.session(mcp.Options{}, nil)
	b := e.session(mcp.Options{}, nil)
	call(t, a, tool("create", map[string]any{"from": e.project, "name": "mine"}), nil)
	// Made outside any session.
	if _, err := e.c.Create(ctxT(t), api.CreateRequest{Name: "theirs", From: e.project}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mine", "theirs"} {
		for _, tl := range []string{"exec", "rm", "diff", "promote", "fork", "snapshot", "ps"} {
			args := map[string]any{"sandbox": name}
			if tl == "exec" {
				args["command"] = "touch /tmp/pwned"
			}
			msg := callFails(t, b, tool(tl, args))
			if !strings.Contains(msg, "not found among this session's sandboxes") {
				t.Errorf("session b %s %s: %q", tl, name, msg)
			}
		}
	}
	var list mcp.ListOut
	call(t, b, tool("list", nil), &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("session b lists %+v", list.Sandboxes)
	}
	if _, err := b.ReadResource(ctxT(t), &sdk.ReadResourceParams{URI: "tine://sandboxes/mine/files" + e.project + "/main.txt"}); err == nil {
		t.Errorf("session b read a file of session a's sandbox")
	}
	// A fork of a's sandbox made through the API (by a CLI, say) is a's too,
	// and stays a's once its parent is removed.
	if _, err := e.c.Fork(ctxT(t), "mine", api.ForkRequest{N: 1, Names: []string{"mine-child"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Fork(ctxT(t), "mine-child", api.ForkRequest{N: 1, Names: []string{"mine-grandchild"}}); err != nil {
		t.Fatal(err)
	}
	call(t, a, tool("rm", map[string]any{"sandbox": "mine-child"}), nil)
	call(t, a, tool("status", map[string]any{"sandbox": "mine-grandchild"}), nil)
	call(t, a, tool("list", nil), &list)
	if len(list.Sandboxes) != 2 {
		t.Errorf("session a lists %+v, want mine and mine-grandchild", list.Sandboxes)
	}
	// Configured to see everything.
	all := e.session(mcp.Options{All: true}, nil)
	call(t, all, tool("status", map[string]any{"sandbox": "theirs"}), nil)
}

// TestResources reads a sandbox's file and its diff as resources.
func TestResources(t *testing.T) {
	e := newEnv(t)
	cs := e.session(mcp.Options{}, nil)
	call(t, cs, tool("create", map[string]any{"from": e.project, "name": "r"}), nil)
	call(t, cs, tool("exec", map[string]any{"sandbox": "r", "command": "printf 'new\\n' > new.txt; printf '\\377\\000' > bin"}), nil)
	tpl, err := cs.ListResourceTemplates(ctxT(t), nil)
	if err != nil || len(tpl.ResourceTemplates) != 3 {
		t.Fatalf("templates: %v %v", tpl, err)
	}
	res, err := cs.ReadResource(ctxT(t), &sdk.ReadResourceParams{URI: "tine://sandboxes/r/files" + e.project + "/new.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Contents[0].Text != "new\n" {
		t.Errorf("file resource: %+v", res.Contents[0])
	}
	res, err = cs.ReadResource(ctxT(t), &sdk.ReadResourceParams{URI: "tine://sandboxes/r/files" + e.project + "/bin"})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Contents[0].Blob) != "\xff\x00" {
		t.Errorf("binary resource: %+v", res.Contents[0])
	}
	res, err = cs.ReadResource(ctxT(t), &sdk.ReadResourceParams{URI: "tine://sandboxes/r/diff"})
	if err != nil {
		t.Fatal(err)
	}
	var changes []mcp.Change
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &changes); err != nil || len(changes) != 2 {
		t.Errorf("diff resource %q: %v", res.Contents[0].Text, err)
	}
}
