package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"tine/api"
)

// TestMCPStdio runs "tine mcp" as a harness does (a child speaking MCP on
// its stdin and stdout) and drives it with the SDK's client: the daemon
// starts on its own, create and exec work, and the structured results come
// back.
func TestMCPStdio(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root")
	}
	base := t.TempDir()
	c := cli{t: t, root: filepath.Join(base, "root")}
	c.ok("init")
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(c.root, api.SocketName)); err == nil {
			c.stopDaemon()
		}
	})
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "hello.txt"), []byte("hello\n"), 0o644)

	ctx := t.Context()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&sdk.CommandTransport{Command: exec.Command(tineBin, "--root", c.root, "mcp")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if cs.InitializeResult().ServerInfo.Name != "tine" {
		t.Errorf("server info %+v", cs.InitializeResult().ServerInfo)
	}
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "create", Arguments: map[string]any{"from": proj, "name": "m"}})
	if err != nil || res.IsError {
		t.Fatalf("create: %v %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox": "m", "command": "cat hello.txt"}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %+v", err, res)
	}
	out, _ := res.StructuredContent.(map[string]any)
	if out["stdout"] != "hello\n" || out["exit_code"] != float64(0) {
		t.Errorf("exec result %+v", res.StructuredContent)
	}
}
