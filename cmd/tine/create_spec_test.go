package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

	// A local feature: installed as root before postCreateCommand, with
	// its option's default and its containerEnv; cached on the second
	// create.
	feat := filepath.Join(proj, ".devcontainer", "greet")
	os.MkdirAll(feat, 0o755)
	os.WriteFile(filepath.Join(feat, "devcontainer-feature.json"), []byte(`{"id": "greet", "options": {"word": {"type": "string", "default": "hi"}},
		"containerEnv": {"GREET_HOME": "/opt/greet"}}`), 0o644)
	os.WriteFile(filepath.Join(feat, "install.sh"), []byte("#!/bin/sh\nmkdir -p /opt/greet && echo \"$WORD $(id -u)\" > /opt/greet/word\n"), 0o644)
	os.WriteFile(dc, []byte(`{"features": {"./greet": {}}, "postCreateCommand": "cat $GREET_HOME/word > feat.txt"}`), 0o644)
	if _, errOut, code = c.run("", "create", "--devcontainer", dc, "--name", "f1"); code != 0 || !strings.Contains(errOut, "0 setup steps from the cache, 2 run") {
		t.Fatalf("create with a feature: exit %d: %s", code, errOut)
	}
	if out := c.ok("exec", "f1", "--", "cat", filepath.Join(proj, "feat.txt")); out != "hi 0\n" {
		t.Errorf("feat.txt %q", out)
	}
	if _, errOut, code = c.run("", "create", "--devcontainer", dc, "--name", "f2"); code != 0 || !strings.Contains(errOut, "2 setup steps from the cache, 0 run") {
		t.Fatalf("second create with a feature: exit %d: %s", code, errOut)
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
	// The policy fields: limits, lifetime, network, a secret, an exec
	// policy and an exposed port, each set on the sandbox.
	tok := filepath.Join(base, "tok")
	os.WriteFile(tok, []byte("TOKVALUE\n"), 0o600)
	c.ok("secret", "set", "TOK", "--from-file", tok)
	os.WriteFile(filepath.Join(proj, "pol.yaml"), []byte(`name: p1
limits: {memory: 256M, cpus: 0.5, pids: 100}
lifetime: 1h
network:
  allow: [example.com]
secrets:
  - {name: TOK, destination: example.com, header: Authorization, prefix: Bearer}
exec:
  deny: ["rm -rf *"]
expose: [8765]
message_to: family,w-*
`), 0o644)
	if _, errOut, code = c.run("", "create", "-f", filepath.Join(proj, "pol.yaml")); code != 0 {
		t.Fatalf("policy spec: exit %d: %s", code, errOut)
	}
	var lim api.LimitsResponse
	json.Unmarshal([]byte(c.ok("limits", "p1", "--json")), &lim)
	if l := lim.Limits; l.MemoryBytes != 256<<20 || l.CPUs != 0.5 || l.Pids != 100 || l.Lifetime != time.Hour {
		t.Errorf("limits %+v", lim)
	}
	if out := c.ok("network", "p1"); !strings.Contains(out, "example.com") || !strings.Contains(out, "allow") {
		t.Errorf("network %q", out)
	}
	if out := c.ok("exec", "p1", "--", "sh", "-c", "echo $TOK"); strings.Contains(out, "TOKVALUE") || !strings.Contains(out, "placeholder") {
		t.Errorf("secret in the sandbox: %q", out)
	}
	if _, errOut, code = c.run("", "exec", "p1", "--", "rm", "-rf", "/tmp/x"); code == 0 || !strings.Contains(errOut, "rm -rf") {
		t.Errorf("exec policy: exit %d: %s", code, errOut)
	}
	if out := c.ok("ports", "p1"); !strings.Contains(out, "8765") {
		t.Errorf("ports %q", out)
	}
	if out := c.ok("status", "p1"); !strings.Contains(out, "messages   to family,w-*") {
		t.Errorf("message_to from the spec: %q", out)
	}
	os.WriteFile(filepath.Join(proj, "img.yaml"), []byte("base:\n  image: debian:12\n"), 0o644)
	if _, errOut, code = c.run("", "create", "-f", filepath.Join(proj, "img.yaml")); code == 0 || !strings.Contains(errOut, "base.image") ||
		!strings.Contains(errOut, `"debian:12"`) || !strings.Contains(errOut, "tine image pull") {
		t.Errorf("image spec: exit %d: %s", code, errOut)
	}
}
