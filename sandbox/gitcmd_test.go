package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestGitBaseCache: the same (directory, snapshot) answers from the cache
// without running git, a new snapshot runs git again, a linked work tree
// (a .git file, HEAD outside the directory) is never cached, and a
// directory with no .git runs no git.
func TestGitBaseCache(t *testing.T) {
	dir := t.TempDir()
	git(t, dir, "init", "-q")
	git(t, dir, "commit", "-q", "--allow-empty", "-m", "one")
	h1 := git(t, dir, "rev-parse", "HEAD")
	var c gitBases
	if b := c.of(dir, "s1"); b.Commit != h1 || b.FS != "s1" {
		t.Fatalf("first: %+v, want commit %s", b, h1)
	}
	git(t, dir, "commit", "-q", "--allow-empty", "-m", "two")
	h2 := git(t, dir, "rev-parse", "HEAD")
	if b := c.of(dir, "s1"); b.Commit != h1 {
		t.Errorf("same snapshot: %+v, want the cached %s", b, h1)
	}
	if b := c.of(dir, "s2"); b.Commit != h2 {
		t.Errorf("new snapshot: %+v, want %s", b, h2)
	}

	wt := filepath.Join(t.TempDir(), "wt")
	git(t, dir, "worktree", "add", "-q", "--detach", wt, h1)
	if b := c.of(wt, "w1"); b.Commit != h1 {
		t.Fatalf("work tree: %+v, want %s", b, h1)
	}
	git(t, wt, "checkout", "-q", "--detach", h2)
	if b := c.of(wt, "w1"); b.Commit != h2 {
		t.Errorf("linked work tree answered from the cache: %+v, want %s", b, h2)
	}

	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if b := c.of(sub, "x"); b.Commit != "" {
		t.Errorf("a directory below the top got a base: %+v", b)
	}
	if b := c.of(t.TempDir(), "y"); b.Commit != "" {
		t.Errorf("a directory outside any repository got a base: %+v", b)
	}

	// A directory with no .git of its own runs no git at all; one with
	// a .git does (a git on PATH that leaves a mark tells).
	bin := t.TempDir()
	mark := filepath.Join(bin, "ran")
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte("#!/bin/sh\n: >"+mark+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	c.of(sub, "x2")
	c.of(t.TempDir(), "y2")
	if _, err := os.Stat(mark); err == nil {
		t.Errorf("git ran for a directory with no .git")
	}
	if b := c.of(dir, "s3"); b.Commit != "" {
		t.Errorf("a failing git gave a base: %+v", b)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Errorf("git did not run for a repository's top: %v", err)
	}
}
