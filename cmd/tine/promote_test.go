package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
)

// TestPromoteEndToEnd drives a three-way promotion through the CLI and a
// real daemon: the host moves after the sandbox is made; the dry run
// shows the plan with the deletion and the clash with both sides (text
// and --json) and writes nothing; --partial applies the rest, merging a
// file both sides edited in different lines; --resume without a stopped
// promotion says so.
func TestPromoteEndToEnd(t *testing.T) {
	c, base := daemonCLI(t)
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "t.txt"), []byte("1\n2\n3\n4\n5\n"), 0o644)
	os.WriteFile(filepath.Join(proj, "x.txt"), []byte("x\n"), 0o644)
	os.WriteFile(filepath.Join(proj, "gone.txt"), []byte("bye\n"), 0o644)
	c.ok("create", "--from", proj, "--name", "p")
	c.ok("exec", "--cwd", proj, "p", "--", "sh", "-c", "sed -i s/^5$/five/ t.txt && echo sandbox > x.txt && rm gone.txt && echo n > n.txt")
	os.WriteFile(filepath.Join(proj, "t.txt"), []byte("one\n2\n3\n4\n5\n"), 0o644)
	os.WriteFile(filepath.Join(proj, "x.txt"), []byte("host\n"), 0o644)

	out, _, code := c.run("", "promote", "p", "--dry-run")
	if code == 0 || !strings.Contains(out, "conflict: x.txt") || !strings.Contains(out, "< host") || !strings.Contains(out, "> sandbox") || !strings.Contains(out, "nothing written") {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	out, _, code = c.run("", "promote", "p", "--json")
	var res api.PromoteResponse
	if err := json.Unmarshal([]byte(out), &res); err != nil || code == 0 || res.Applied || len(res.Merge) != 1 || res.Merge[0].Hunks[0].Theirs[0] != "sandbox\n" {
		t.Fatalf("--json: exit %d %v\n%s", code, err, out)
	}
	if _, err := os.Stat(filepath.Join(proj, "n.txt")); err == nil {
		t.Fatal("written despite the conflict")
	}
	out = c.ok("promote", "p", "--partial", "--dry-run")
	if !strings.Contains(out, "D gone.txt") || !strings.Contains(out, "A n.txt") || !strings.Contains(out, "merged line by line: t.txt") {
		t.Fatalf("partial dry run:\n%s", out)
	}
	out = c.ok("promote", "p", "--partial")
	if !strings.Contains(out, "applied") {
		t.Fatalf("partial:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(proj, "t.txt")); string(b) != "one\n2\n3\n4\nfive\n" {
		t.Fatalf("t.txt %q", b)
	}
	if _, err := os.Stat(filepath.Join(proj, "gone.txt")); !os.IsNotExist(err) {
		t.Fatalf("gone.txt: %v", err)
	}
	if _, errOut, code := c.run("", "promote", "p", "--resume"); code == 0 || !strings.Contains(errOut, "no journal") {
		t.Fatalf("--resume: exit %d %s", code, errOut)
	}
}
