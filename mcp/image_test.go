package mcp_test

import (
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
	"tine/internal/testimage"
	"tine/mcp"
)

// TestCreateOverImage: the create tool's image runs the sandbox over an
// image's files; an unknown image is named.
func TestCreateOverImage(t *testing.T) {
	e := newEnv(t)
	tb := filepath.Join(t.TempDir(), "bb.tar")
	testimage.WriteTarball(t, tb, "example.test/bb:1", testimage.BusyboxImage(t))
	if _, err := e.c.ImportImage(ctxT(t), api.ImportRequest{Path: tb, Name: "bb"}); err != nil {
		t.Fatal(err)
	}
	cs := e.session(mcp.Options{}, nil)
	var created struct{ Sandbox mcp.Sandbox }
	call(t, cs, tool("create", map[string]any{"from": e.project, "name": "img", "image": "bb"}), &created)
	if !strings.HasPrefix(created.Sandbox.Image, "bb@sha256:") {
		t.Errorf("created: %+v", created.Sandbox)
	}
	var out struct {
		Stdout string `json:"stdout"`
	}
	call(t, cs, tool("exec", map[string]any{"sandbox": "img", "command": "cat /only-in-image"}), &out)
	if out.Stdout != "image file\n" {
		t.Errorf("exec in the image sandbox: %q", out.Stdout)
	}
	if msg := callFails(t, cs, tool("create", map[string]any{"from": e.project, "image": "nosuch"})); !strings.Contains(msg, "nosuch") {
		t.Errorf("create over an unknown image: %s", msg)
	}
}
