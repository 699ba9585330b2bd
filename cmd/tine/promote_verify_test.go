package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
	"tine/sandbox"
)

// TestPromoteVerifyEndToEnd drives --verify through the CLI and a real
// daemon. The sandbox renames a word in api.txt and its one user; the
// host then adds a file using the old word, which the sandbox never saw.
// The check fails on the merged result: exit non-zero naming the check,
// its output shown, nothing written, the record in --json and in the
// state root. Once the host fixes its file the check passes and the
// promotion writes; into git, a failing check makes no branch.
func TestPromoteVerifyEndToEnd(t *testing.T) {
	c, base := daemonCLI(t)
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "api.txt"), []byte("greet\n"), 0o644)
	os.WriteFile(filepath.Join(proj, "a.use"), []byte("greet\n"), 0o644)
	os.WriteFile(filepath.Join(proj, "check.sh"), []byte(`for f in *.use; do w=$(cat $f); grep -qx "$w" api.txt || { echo "missing $w used by $f"; exit 1; }; done; echo all-used`+"\n"), 0o755)
	gitIn(t, proj, "init", "-q", "-b", "main")
	gitIn(t, proj, "add", "-A")
	gitIn(t, proj, "-c", "user.name=H", "-c", "user.email=h@example.com", "commit", "-q", "-m", "first")
	c.ok("create", "--from", proj, "--name", "v")
	c.ok("exec", "--cwd", proj, "v", "--", "sh", "-c", "echo hello > api.txt && echo hello > a.use")
	os.WriteFile(filepath.Join(proj, "b.use"), []byte("greet\n"), 0o644)

	out, errOut, code := c.run("", "promote", "v", "--verify", "sh check.sh")
	if code == 0 || !strings.Contains(errOut, `check "sh check.sh"`) || !strings.Contains(out, "missing greet used by b.use") || !strings.Contains(out, "FAILED (exit 1)") || !strings.Contains(out, "recorded in") {
		t.Fatalf("failing check: exit %d\n%s\n%s", code, out, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(proj, "api.txt")); string(b) != "greet\n" {
		t.Fatalf("written despite the failed check: %q", b)
	}
	out, _, code = c.run("", "promote", "v", "--verify", "sh check.sh", "--json")
	var res api.PromoteResponse
	if err := json.Unmarshal([]byte(out), &res); err != nil || code == 0 || res.Applied || res.Error == nil || res.Error.Code != "verify_failed" ||
		res.Verify == nil || res.Verify.ExitCode != 1 || res.Verify.Command != "sh check.sh" || !strings.Contains(res.Verify.Output, "b.use") || res.Record == "" {
		t.Fatalf("--json: exit %d %v\n%s", code, err, out)
	}
	var rec sandbox.PromoteRecord
	if b, err := os.ReadFile(res.Record); err != nil || json.Unmarshal(b, &rec) != nil || rec.Verify.ExitCode != 1 || rec.Applied || !strings.HasPrefix(res.Record, c.root) {
		t.Fatalf("record %s: %v %+v", res.Record, err, rec)
	}
	// Into git, onto the host's HEAD after it committed b.use: no branch.
	gitIn(t, proj, "add", "b.use")
	gitIn(t, proj, "-c", "user.name=H", "-c", "user.email=h@example.com", "commit", "-q", "-m", "b")
	if out, _, code := c.run("", "promote", "v", "--git-branch", "checked", "--onto", "HEAD", "--verify", "sh check.sh"); code == 0 || !strings.Contains(out, "missing greet used by b.use") {
		t.Fatalf("git, failing check: exit %d\n%s", code, out)
	}
	if b := gitIn(t, proj, "branch", "--list", "checked"); b != "" {
		t.Fatalf("branch made despite the failed check: %q", b)
	}
	// The host fixes its user: both pass.
	os.WriteFile(filepath.Join(proj, "b.use"), []byte("hello\n"), 0o644)
	gitIn(t, proj, "-c", "user.name=H", "-c", "user.email=h@example.com", "commit", "-q", "-a", "-m", "b uses hello")
	out = c.ok("promote", "v", "--git-branch", "checked", "--onto", "HEAD", "--verify", "sh check.sh")
	if !strings.Contains(out, `check "sh check.sh" passed`) || !strings.Contains(out, "branch checked at") {
		t.Fatalf("git, passing check:\n%s", out)
	}
	out = c.ok("promote", "v", "--verify", "sh check.sh", "--verify-timeout", "5m")
	if !strings.Contains(out, `check "sh check.sh" passed`) || !strings.Contains(out, "applied") {
		t.Fatalf("passing check:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(proj, "api.txt")); string(b) != "hello\n" {
		t.Fatalf("api.txt %q", b)
	}
	if _, errOut, code := c.run("", "promote", "v", "--keep-verify"); code == 0 || !strings.Contains(errOut, "--keep-verify goes with --verify") {
		t.Fatalf("--keep-verify alone: exit %d %s", code, errOut)
	}
}
