package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tine/api"
	"tine/api/client"
	"tine/sandbox"
)

// TestPolicyEndToEnd drives limits, the OOM report, update, freeze and
// thaw, the exec policy with approvals, lifetime across a daemon restart
// and the audit log (with tampering) through the CLI and a real daemon.
func TestPolicyEndToEnd(t *testing.T) {
	c, base := daemonCLI(t)
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	c.ok("create", "--from", proj, "--name", "p", "--memory", "64M", "--cpus", "1.5", "--tmpfs", "16M", "--idle", "1h")
	var lim api.LimitsResponse
	if err := json.Unmarshal([]byte(c.ok("limits", "p", "--json")), &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Limits.MemoryBytes != 64<<20 || lim.Limits.CPUs != 1.5 || lim.Limits.TmpfsBytes != 16<<20 || lim.Limits.Idle != time.Hour || lim.Usage == nil {
		t.Fatalf("limits: %+v", lim)
	}
	if out := c.ok("exec", "p", "--", "sh", "-c", "df -k /tmp | tail -1"); strings.Fields(out)[1] != "16384" {
		t.Fatalf("/tmp of a 16M tmpfs: %q", out)
	}

	if m, _ := filepath.Glob("/dev/nvidia*"); len(m) == 0 {
		if _, errOut, code := c.run("", "create", "--from", proj, "--name", "g", "--gpu"); code != 2 || !strings.Contains(errOut, "nvidia") {
			t.Fatalf("create --gpu without a GPU: exit %d, %q", code, errOut)
		}
	}

	// Over its memory limit: killed alone, reported on the events stream
	// and in the audit log; after update --memory the same command runs.
	cl := client.New(filepath.Join(c.root, api.SocketName))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := cl.Events(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	hog := `x=$(head -c 150000000 /dev/zero | tr '\0' a); echo ${#x}`
	if out, _, code := c.run("", "exec", "p", "--", "sh", "-c", hog); code == 0 {
		t.Fatalf("150 MB in a shell variable under 64M: exit 0, %q", out)
	}
	got := false
	for deadline := time.After(10 * time.Second); !got; {
		select {
		case ev := <-events:
			got = ev.Type == sandbox.EventOOMKill
		case <-deadline:
			t.Fatal("no oom-kill event on the API")
		}
	}
	if out := c.ok("audit", "p"); !strings.Contains(out, "oom-kill") {
		t.Fatalf("no oom-kill in the audit log:\n%s", out)
	}
	c.ok("update", "p", "--memory", "1G")
	if out := c.ok("exec", "p", "--", "sh", "-c", hog); out != "150000000\n" {
		t.Fatalf("after update --memory 1G: %q", out)
	}

	// Freeze and thaw.
	c.ok("freeze", "p")
	if out := c.ok("limits", "p"); !strings.Contains(out, "frozen") {
		t.Fatalf("limits of a frozen sandbox:\n%s", out)
	}
	if _, errOut, code := c.run("", "exec", "p", "--", "true"); code == 0 || !strings.Contains(errOut, "frozen") {
		t.Fatalf("exec in a frozen sandbox: exit %d, %q", code, errOut)
	}
	c.ok("thaw", "p")
	c.ok("exec", "p", "--", "true")

	// Exec policy and approvals.
	c.ok("exec-policy", "p", "--set", `{"echo *": "allow", "rm -rf *": "deny", "*": "ask"}`, "--freeze-on-ask")
	if out := c.ok("exec", "p", "--", "echo", "hi"); out != "hi\n" {
		t.Fatalf("allowed echo: %q", out)
	}
	if _, errOut, code := c.run("", "exec", "p", "--", "rm", "-rf", "/tmp/x"); code == 0 || !strings.Contains(errOut, "denied") {
		t.Fatalf("denied rm: exit %d, %q", code, errOut)
	}
	asked := func(args ...string) (*exec.Cmd, *strings.Builder, string) {
		cmd := exec.Command(tineBin, append([]string{"--root", c.root, "exec", "p", "--"}, args...)...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 200; i++ {
			var as []api.Approval
			json.Unmarshal([]byte(c.ok("approvals", "--json")), &as)
			if len(as) == 1 {
				if as[0].Kind != "exec" || as[0].State != "pending" || !strings.HasPrefix(as[0].Reason, strings.Join(args, " ")+" (rule *)") ||
					!strings.Contains(as[0].Reason, "frozen") {
					t.Fatalf("approval %+v", as[0])
				}
				return cmd, &out, as[0].ID
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("no approval pending")
		return nil, nil, ""
	}
	cmd, out, id := asked("hostname")
	if l := c.ok("limits", "p"); !strings.Contains(l, "frozen") {
		t.Fatalf("not frozen while waiting:\n%s", l)
	}
	c.ok("approve", id)
	if err := cmd.Wait(); err != nil || out.String() != "p\n" {
		t.Fatalf("approved hostname: %v %q", err, out.String())
	}
	cmd, out, id = asked("ls", "/")
	c.ok("deny", id)
	if err := cmd.Wait(); err == nil || !strings.Contains(out.String(), "denied") {
		t.Fatalf("denied ls: %v %q", err, out.String())
	}

	// The audit log has it all, and verifies.
	text := c.ok("audit", "p")
	for _, k := range []string{"create", "exec ", "oom-kill", "limits", "freeze", "thaw", "exec-policy", "exec-denied", "approval-asked", "approval-granted", "approval-denied"} {
		if !strings.Contains(text, k) {
			t.Errorf("audit log lacks %q:\n%s", k, text)
		}
	}
	// --follow prints records appended after it started.
	fcmd := exec.Command(tineBin, "--root", c.root, "audit", "p", "--follow", "--json")
	fr, _ := fcmd.StdoutPipe()
	if err := fcmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer fcmd.Process.Kill()
	c.ok("exec", "p", "--", "echo", "followed")
	seen := make(chan bool, 1)
	go func() {
		dec := json.NewDecoder(fr)
		for {
			var r struct {
				Kind   string          `json:"kind"`
				Fields json.RawMessage `json:"fields"`
			}
			if dec.Decode(&r) != nil {
				seen <- false
				return
			}
			if r.Kind == "exec" && strings.Contains(string(r.Fields), "followed") {
				seen <- true
				return
			}
		}
	}()
	select {
	case ok := <-seen:
		if !ok {
			t.Fatal("audit --follow ended before the new record")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("audit --follow did not print the exec record")
	}
	fcmd.Process.Kill()
	fcmd.Wait()
	if out := c.ok("audit", "verify", "p"); !strings.Contains(out, "whole") {
		t.Fatalf("verify: %s", out)
	}
	c.ok("audit", "verify")

	// Lifetime across a daemon restart.
	c.ok("create", "--from", proj, "--name", "short", "--lifetime", "2s")
	c.stopDaemon()
	time.Sleep(2500 * time.Millisecond)
	for deadline := time.Now().Add(15 * time.Second); ; {
		if !strings.Contains(c.ok("ls"), "short") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a sandbox past its lifetime survived a daemon restart")
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Tampering and truncation are caught.
	logPath := filepath.Join(c.root, "audit", "sandboxes", "p.jsonl")
	b, _ := os.ReadFile(logPath)
	os.WriteFile(logPath, []byte(strings.Replace(string(b), `"kind":"exec-denied"`, `"kind":"exec-allowed"`, 1)), 0o600)
	if out, _, code := c.run("", "audit", "verify", "p"); code != 1 || !strings.Contains(out, "DAMAGED") {
		t.Fatalf("verify of an edited log: exit %d, %s", code, out)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	os.WriteFile(logPath, []byte(strings.Join(lines[:len(lines)-2], "")), 0o600)
	if out, _, code := c.run("", "audit", "verify", "p"); code != 1 || !strings.Contains(out, "cut from its end") {
		t.Fatalf("verify of a truncated log: exit %d, %s", code, out)
	}
}
