package api_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
)

func gitAPI(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-c", "core.hooksPath=/dev/null", "-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestPromoteGitAPI: through the API, a promotion to a git branch makes
// the commit on the base; --onto HEAD with a clash answers the conflict
// with both sides and makes no branch; a fork with git_branches records a
// branch that a promotion naming none goes to; a sandbox whose directory
// is no repository is refused.
func TestPromoteGitAPI(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	p := e.project
	os.WriteFile(filepath.Join(p, "t.txt"), []byte("a\nb\nc\n"), 0o644)
	e.create("plain")
	if _, err := e.c.Promote(ctx, "plain", api.PromoteRequest{GitBranch: "x"}); err == nil || !strings.Contains(err.Error(), "git") {
		t.Fatalf("not a repository: %v", err)
	}
	gitAPI(t, p, "init", "-q", "-b", "main")
	gitAPI(t, p, "add", "-A")
	gitAPI(t, p, "-c", "user.name=H", "-c", "user.email=h@example.com", "commit", "-q", "-m", "first")
	base := gitAPI(t, p, "rev-parse", "HEAD")
	e.create("s")
	e.sh("s", "cd "+p+" && sed -i s/^c$/C/ t.txt")
	res, err := e.c.Promote(ctx, "s", api.PromoteRequest{GitBranch: "one", Author: "Ann <ann@example.com>"})
	if err != nil || res.Git == nil || !res.Git.Applied || res.Git.Parent != base || len(res.Git.Changes) != 1 {
		t.Fatalf("one: %+v %v", res, err)
	}
	os.WriteFile(filepath.Join(p, "t.txt"), []byte("a\nb\nhost\n"), 0o644)
	gitAPI(t, p, "-c", "user.name=H", "-c", "user.email=h@example.com", "commit", "-q", "-a", "-m", "host")
	res, err = e.c.Promote(ctx, "s", api.PromoteRequest{GitBranch: "two", Onto: "HEAD"})
	if err != nil || res.Applied || res.Error == nil || res.Error.Code != "conflict" || len(res.Merge) != 1 || res.Merge[0].Hunks[0].Theirs[0] != "C\n" {
		t.Fatalf("clash: %+v %v", res, err)
	}
	kids, err := e.c.Fork(ctx, "s", api.ForkRequest{N: 2, GitBranches: "try-{i}"})
	if err != nil || len(kids) != 2 || kids[1].GitBase.Branch != "try-2" {
		t.Fatalf("fork: %+v %v", kids, err)
	}
	for _, k := range kids {
		if res, err := e.c.Promote(ctx, k.Name, api.PromoteRequest{Git: true}); err != nil || !res.Git.Applied || res.Git.Parent != base {
			t.Fatalf("promote %s: %+v %v", k.Name, res, err)
		}
	}
	if got := gitAPI(t, p, "show", "try-2:t.txt"); got != "a\nb\nC" {
		t.Fatalf("try-2 t.txt %q", got)
	}
	if _, err := e.c.Fork(ctx, "s", api.ForkRequest{N: 2, GitBranches: "same"}); err == nil {
		t.Fatal("one branch for two forks accepted")
	}
}
