package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
)

// gitIn runs git in dir as the test's observer (hooks off, no optional
// index refresh) and returns its trimmed output.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	c := exec.Command("git", append([]string{"-c", "core.hooksPath=/dev/null", "-C", dir}, args...)...)
	c.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestPromoteGitEndToEnd drives promotion to git branches through the CLI
// and a real daemon, on a repository whose hooks (in .git/hooks and a
// configured core.hooksPath) write markers: --git-branch NAME with a
// message and author; --onto HEAD after the host committed, in --json;
// then fork -n 3 --git-branches 'try-{i}' and a bare --git-branch per
// fork puts each on its own branch from the same parent, side by side in
// git log --graph. No hook runs, git status is unchanged, fsck passes.
func TestPromoteGitEndToEnd(t *testing.T) {
	c, base := daemonCLI(t)
	proj, markers, hooks := filepath.Join(base, "proj"), filepath.Join(base, "markers"), filepath.Join(base, "hooks")
	for _, d := range []string{proj, markers, hooks} {
		os.MkdirAll(d, 0o755)
	}
	gitIn(t, proj, "init", "-q", "-b", "main")
	gitIn(t, proj, "config", "user.name", "Host")
	gitIn(t, proj, "config", "user.email", "host@example.com")
	os.WriteFile(filepath.Join(proj, "t.txt"), []byte("1\n2\n3\n4\n5\n"), 0o644)
	gitIn(t, proj, "add", "-A")
	gitIn(t, proj, "commit", "-q", "-m", "first")
	for _, hd := range []string{filepath.Join(proj, ".git", "hooks"), hooks} {
		for _, h := range []string{"pre-commit", "commit-msg", "post-commit", "post-checkout", "reference-transaction", "post-rewrite", "post-index-change"} {
			os.WriteFile(filepath.Join(hd, h), []byte(fmt.Sprintf("#!/bin/sh\ntouch %s/%s-%s\n", markers, filepath.Base(hd), h)), 0o755)
		}
	}
	gitIn(t, proj, "config", "core.hooksPath", hooks)
	first := gitIn(t, proj, "rev-parse", "HEAD")
	os.WriteFile(filepath.Join(proj, "wip.txt"), []byte("host wip\n"), 0o644)

	c.ok("create", "--from", proj, "--name", "p")
	c.ok("exec", "--cwd", proj, "p", "--", "sh", "-c", "sed -i s/^5$/five/ t.txt && echo n > n.txt")
	out := c.ok("promote", "p", "--git-branch", "agent", "--message", "agent work", "--author", "Ann <ann@example.com>")
	if !strings.Contains(out, "branch agent at") || !strings.Contains(out, "M 100644 t.txt") {
		t.Fatalf("promote --git-branch:\n%s", out)
	}
	if got := gitIn(t, proj, "log", "-1", "--format=%P|%an|%s", "agent"); got != first+"|Ann|agent work" {
		t.Fatalf("agent commit %q", got)
	}

	// The host commits; --onto HEAD merges line by line (JSON).
	os.WriteFile(filepath.Join(proj, "t.txt"), []byte("one\n2\n3\n4\n5\n"), 0o644)
	gitIn(t, proj, "commit", "-q", "-a", "-m", "host")
	head := gitIn(t, proj, "rev-parse", "HEAD")
	status0 := gitIn(t, proj, "status", "--porcelain")
	out = c.ok("promote", "p", "--git-branch", "rebased", "--onto", "HEAD", "--json")
	var res api.PromoteResponse
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Git == nil || !res.Git.Applied || res.Git.Parent != head || res.Git.HostCommits != 1 {
		t.Fatalf("--onto --json: %v\n%s", err, out)
	}
	if got := gitIn(t, proj, "show", "rebased:t.txt"); got != "one\n2\n3\n4\nfive" {
		t.Fatalf("rebased t.txt %q", got)
	}

	// Branch per fork.
	out = c.ok("fork", "p", "-n", "3", "--git-branches", "try-{i}")
	if !strings.Contains(out, "git branch try-3") {
		t.Fatalf("fork:\n%s", out)
	}
	for i := 1; i <= 3; i++ {
		c.ok("exec", "--cwd", proj, fmt.Sprintf("p-%d", i), "--", "sh", "-c", fmt.Sprintf("echo %d > fork.txt", i))
		c.ok("promote", fmt.Sprintf("p-%d", i), "--git-branch")
		if got := gitIn(t, proj, "show", fmt.Sprintf("try-%d:fork.txt", i)); got != fmt.Sprint(i) {
			t.Fatalf("try-%d fork.txt %q", i, got)
		}
		if got := gitIn(t, proj, "rev-parse", fmt.Sprintf("try-%d^", i)); got != first {
			t.Fatalf("try-%d's parent %s, want %s", i, got, first)
		}
	}
	graph := gitIn(t, proj, "log", "--graph", "--all", "--format=%d %s")
	t.Logf("git log --graph --all:\n%s", graph)
	// Three branches that split from one commit: the graph draws them
	// in columns side by side (which one is drawn first depends on the
	// commit times, often the same second).
	if !strings.Contains(graph, "(try-1)") || !strings.Contains(graph, "(try-2)") || !strings.Contains(graph, "(try-3)") ||
		strings.Count(graph, "| *  (try-") < 2 || strings.Count(graph, "|/") < 4 {
		t.Fatalf("graph:\n%s", graph)
	}
	if _, _, code := c.run("", "promote", "p-1", "--git-branch"); code == 0 {
		t.Fatal("a second promotion overwrote try-1")
	}

	if m, _ := os.ReadDir(markers); len(m) != 0 {
		t.Fatalf("hooks ran: %v", m)
	}
	if s := gitIn(t, proj, "status", "--porcelain"); s != status0 {
		t.Fatalf("git status changed:\n%s\nwas\n%s", s, status0)
	}
	gitIn(t, proj, "fsck", "--strict")
}
