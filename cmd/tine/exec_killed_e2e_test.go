package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestExecKilled: through the CLI and a real daemon, a command killed
// from outside itself exits 137 and one stderr line names the sandbox
// and why: over its --memory limit, its sandbox stopped or removed under
// it. exec --json's result carries killed_by and killed_reason.
func TestExecKilled(t *testing.T) {
	c, base := daemonCLI(t)
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	c.ok("create", "--from", proj, "--name", "a", "--memory", "64M")

	hog := `x=$(head -c 150000000 /dev/zero | tr '\0' a); echo ${#x}`
	const oomLine = "tine exec: sandbox \"a\": killed: out of memory (memory limit 64 MiB)\n"
	if out, errOut, code := c.run("", "exec", "a", "--", "sh", "-c", hog); code != 137 || out != "" || errOut != oomLine {
		t.Errorf("hog over --memory 64M: exit %d, stdout %q, stderr %q; want 137 and %q", code, out, errOut, oomLine)
	}
	var res execResult
	out, errOut, code := c.run("", "exec", "--json", "a", "--", "sh", "-c", hog)
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 137 || res.ExitCode != 137 || res.Signal != 9 ||
		res.KilledBy != "oom" || res.KilledReason != "out of memory (memory limit 64 MiB)" || errOut != oomLine {
		t.Errorf("exec --json of the hog: exit %d, stdout %q (%v), stderr %q", code, out, err, errOut)
	}
	// A command that kills itself says nothing more.
	if _, errOut, code := c.run("", "exec", "a", "--", "sh", "-c", "kill -9 $$"); code != 137 || errOut != "" {
		t.Errorf("kill -9 $$: exit %d, stderr %q; want 137 and nothing", code, errOut)
	}

	// Stopped, then removed, under a running sleep.
	killWhile := func(args ...string) (string, string, int) {
		t.Helper()
		type result struct {
			out, errOut string
			code        int
		}
		done := make(chan result, 1)
		go func() {
			out, errOut, code := c.run("", "exec", "--json", "a", "--", "sh", "-c", "touch /tmp/ready; exec sleep 60")
			done <- result{out, errOut, code}
		}()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, _, code := c.run("", "exec", "a", "--", "test", "-e", "/tmp/ready"); code == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the sleep did not start")
			}
		}
		c.ok(args...)
		select {
		case r := <-done:
			return r.out, r.errOut, r.code
		case <-time.After(20 * time.Second):
			t.Fatalf("tine exec: no exit 20 s after tine %q", args)
		}
		return "", "", 0
	}
	for _, tc := range []struct {
		args     []string
		by, line string
	}{
		{[]string{"stop", "a"}, "stopped", "tine exec: sandbox \"a\": killed: the sandbox was stopped\n"},
		{[]string{"rm", "-f", "a"}, "removed", "tine exec: sandbox \"a\": killed: the sandbox was removed\n"},
	} {
		out, errOut, code := killWhile(tc.args...)
		res = execResult{}
		if err := json.Unmarshal([]byte(out), &res); err != nil || code != 137 || res.ExitCode != 137 || res.Signal != 9 ||
			res.KilledBy != tc.by || res.Error != nil || errOut != tc.line {
			t.Errorf("sleep under tine %q: exit %d, stdout %q (%v), stderr %q; want 137, killed_by %s", tc.args, code, out, err, errOut, tc.by)
		}
		if tc.args[0] == "stop" {
			c.ok("start", "a")
		}
	}
}
