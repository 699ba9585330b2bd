package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
)

// TestCreateFromSpec: tine create -f tine.yaml runs the setup once and
// takes it from the cache the second time; --devcontainer reads the
// de-facto spec and refuses initializeCommand with the reason, running
// nothing.
func TestCreateFromSpec(t *testing.T) {
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
	os.MkdirAll(filepath.Join(proj, ".devcontainer"), 0o755)
	os.WriteFile(filepath.Join(proj, "tine.yaml"), []byte("env: {WHO: yaml}\nsetup:\n  - echo $WHO > built.txt\n"), 0o644)
	_, errOut, code := c.run("", "create", "-f", filepath.Join(proj, "tine.yaml"), "--name", "y1")
	if code != 0 || !strings.Contains(errOut, "0 setup steps from the cache, 1 run") {
		t.Fatalf("create -f: exit %d: %s", code, errOut)
	}
	if out := c.ok("exec", "y1", "--", "cat", filepath.Join(proj, "built.txt")); out != "yaml\n" {
		t.Errorf("built.txt %q", out)
	}
	_, errOut, code = c.run("", "create", "-f", filepath.Join(proj, "tine.yaml"), "--name", "y2")
	if code != 0 || !strings.Contains(errOut, "1 setup steps from the cache, 0 run") {
		t.Fatalf("second create -f: exit %d: %s", code, errOut)
	}

	dc := filepath.Join(proj, ".devcontainer", "devcontainer.json")
	os.WriteFile(dc, []byte(`{
		// comments are allowed
		"containerEnv": {"WHO": "dc"},
		"postCreateCommand": "echo $WHO > dc.txt",
	}`), 0o644)
	c.ok("create", "--devcontainer", dc, "--name", "d1")
	if out := c.ok("exec", "d1", "--", "cat", filepath.Join(proj, "dc.txt")); out != "dc\n" {
		t.Errorf("dc.txt %q", out)
	}

	marker := filepath.Join(base, "initialized")
	os.WriteFile(dc, []byte(`{"initializeCommand": "touch `+marker+`", "postCreateCommand": "true"}`), 0o644)
	_, errOut, code = c.run("", "create", "--devcontainer", dc)
	if code == 0 || !strings.Contains(errOut, "initializeCommand runs on the host") {
		t.Errorf("initializeCommand: exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("initializeCommand ran")
	}
	os.WriteFile(filepath.Join(proj, "net.yaml"), []byte("network:\n  allow: [example.com]\n"), 0o644)
	if _, errOut, code = c.run("", "create", "-f", filepath.Join(proj, "net.yaml")); code == 0 || !strings.Contains(errOut, "no egress control yet") {
		t.Errorf("network spec: exit %d: %s", code, errOut)
	}
}
