package sandbox_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/cowfs"
	"tine/sandbox"
)

// hookNames are the hooks a porcelain commit, checkout, rebase or ref
// update would run.
var hookNames = []string{"pre-commit", "commit-msg", "post-commit", "post-checkout", "reference-transaction", "post-rewrite", "pre-auto-gc", "post-index-change"}

// gitRepoWithHooks makes dir a git repository with one commit whose
// hooks (in .git/hooks and in a core.hooksPath set in its config) each
// write a marker file into markers; it checks that they do fire.
func gitRepoWithHooks(t *testing.T, dir, markers string) {
	t.Helper()
	hooksPath := filepath.Join(filepath.Dir(markers), "hookdir")
	for _, d := range []string{markers, hooksPath} {
		os.MkdirAll(d, 0o755)
	}
	hostGit(t, dir, "init", "-q", "-b", "main")
	hostGit(t, dir, "config", "user.name", "Host")
	hostGit(t, dir, "config", "user.email", "host@example.com")
	for i, hd := range []string{filepath.Join(dir, ".git", "hooks"), hooksPath} {
		for _, h := range hookNames {
			script := fmt.Sprintf("#!/bin/sh\ntouch %s/%s-%s\n", markers, []string{"git-dir", "hooks-path"}[i], h)
			if err := os.WriteFile(filepath.Join(hd, h), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("1\n2\n3\n4\n5\n6\n7\n8\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("*.log\n"), 0o644)
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "b.txt"), []byte("b\n"), 0o644)
	hostGit(t, dir, "-c", "core.hooksPath=/dev/null", "add", "-A")
	hostGit(t, dir, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "first")
	// The hooks work: a ref update through git runs the configured ones.
	hostGit(t, dir, "config", "core.hooksPath", hooksPath)
	if out, err := exec.Command("git", "-C", dir, "update-ref", "refs/heads/probe", "HEAD").CombinedOutput(); err != nil {
		t.Fatalf("probe: %v: %s", err, out)
	}
	if m, _ := os.ReadDir(markers); len(m) == 0 {
		t.Fatal("the hooks do not fire; the test would prove nothing")
	}
	hostGit(t, dir, "-c", "core.hooksPath=/dev/null", "update-ref", "-d", "refs/heads/probe")
	os.RemoveAll(markers)
	os.MkdirAll(markers, 0o755)
}

// hostGit runs git in dir, as the test's own observer: with hooks off
// and no optional index refresh, so that it changes nothing it checks.
func hostGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	c := exec.Command("git", append([]string{"-c", "core.hooksPath=/dev/null", "-C", dir}, args...)...)
	c.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// hostCommit commits the work tree's state with hooks off.
func hostCommit(t *testing.T, dir, msg string) {
	hostGit(t, dir, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-a", "-m", msg)
}

// TestPromoteGitHooks: every kind of promotion to a git branch (plain,
// --onto HEAD with a line merge, a clash, --keep-commits, a hostile .git)
// writes only objects and a new branch: no hook of the host runs, HEAD,
// the index and git status are unchanged, and git fsck --strict passes.
func TestPromoteGitHooks(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	p := e.project
	markers := filepath.Join(filepath.Dir(p), "markers")
	gitRepoWithHooks(t, p, markers)
	os.WriteFile(filepath.Join(p, "untracked.txt"), []byte("u\n"), 0o644)
	base := hostGit(t, p, "rev-parse", "HEAD")
	status0 := hostGit(t, p, "status", "--porcelain")
	index0, _ := os.ReadFile(filepath.Join(p, ".git", "index"))

	info := e.create("g", sandbox.Limits{})
	if info.GitBase.Commit != base || info.GitBase.FS == "" {
		t.Fatalf("git base %+v, want commit %s", info.GitBase, base)
	}
	e.mustSh("g", fmt.Sprintf("cd %s && sed -i s/^7$/seven/ a.txt && echo new > new.txt && rm sub/b.txt && echo noise > debug.log && printf '#!/bin/sh\\n' > x.sh && chmod +x x.sh && ln -s a.txt link && echo junk > .git/junk", p))

	// Plain: parent is the base; ignored and .git files stay out.
	res, err := e.m.PromoteGit(ctx, "g", sandbox.GitPromoteOptions{Branch: "plain", Message: "plain\n", Author: "Ann <ann@example.com>"})
	if err != nil || !res.Applied || res.Parent != base {
		t.Fatalf("plain: %v %+v", err, res)
	}
	if got := hostGit(t, p, "show", "plain:a.txt"); !strings.Contains(got, "seven") {
		t.Fatalf("plain a.txt %q", got)
	}
	tree := hostGit(t, p, "ls-tree", "-r", "plain")
	for _, want := range []string{"100755 blob", "x.sh", "120000 blob", "new.txt"} {
		if !strings.Contains(tree, want) {
			t.Fatalf("tree lacks %q:\n%s", want, tree)
		}
	}
	for _, not := range []string{"debug.log", "sub/b.txt", "junk", "untracked.txt"} {
		if strings.Contains(tree, not) {
			t.Fatalf("tree holds %q:\n%s", not, tree)
		}
	}
	if a := hostGit(t, p, "log", "-1", "--format=%an <%ae>|%s", "plain"); a != "Ann <ann@example.com>|plain" {
		t.Fatalf("author and subject %q", a)
	}
	if _, err := e.m.PromoteGit(ctx, "g", sandbox.GitPromoteOptions{Branch: "plain"}); err == nil {
		t.Fatal("an existing branch was overwritten")
	}

	// The host moves on another line: --onto HEAD merges line by line.
	os.WriteFile(filepath.Join(p, "a.txt"), []byte("1\ntwo\n3\n4\n5\n6\n7\n8\n"), 0o644)
	hostCommit(t, p, "host two")
	head := hostGit(t, p, "rev-parse", "HEAD")
	if st, err := e.m.Status(ctx, "g"); err != nil || st.Stale.Git == nil || st.Stale.Git.Commits != 1 || st.Stale.Git.Changed != 1 || st.Stale.Git.Head != head {
		t.Fatalf("git staleness: %v %+v", err, st)
	}
	status0 = hostGit(t, p, "status", "--porcelain")
	index0, _ = os.ReadFile(filepath.Join(p, ".git", "index"))
	res, err = e.m.PromoteGit(ctx, "g", sandbox.GitPromoteOptions{Branch: "onto", Onto: "HEAD"})
	if err != nil || !res.Applied || res.Parent != head || len(res.Merged) != 1 || res.HostCommits != 1 {
		t.Fatalf("onto: %v %+v", err, res)
	}
	if got := hostGit(t, p, "show", "onto:a.txt"); got != "1\ntwo\n3\n4\n5\n6\nseven\n8" {
		t.Fatalf("onto a.txt %q", got)
	}

	// The same line on both sides: a conflict, no branch.
	os.WriteFile(filepath.Join(p, "a.txt"), []byte("1\ntwo\n3\n4\n5\n6\nSEVEN\n8\n"), 0o644)
	hostCommit(t, p, "host seven")
	status0 = hostGit(t, p, "status", "--porcelain")
	index0, _ = os.ReadFile(filepath.Join(p, ".git", "index"))
	res, err = e.m.PromoteGit(ctx, "g", sandbox.GitPromoteOptions{Branch: "clash", Onto: "HEAD"})
	if !errors.Is(err, cowfs.ErrConflict) || len(res.Merge) != 1 || res.Merge[0].Path != "a.txt" || len(res.Merge[0].Hunks) != 1 {
		t.Fatalf("clash: %v %+v", err, res)
	}
	if out, err := exec.Command("git", "-C", p, "rev-parse", "--verify", "-q", "clash").CombinedOutput(); err == nil {
		t.Fatalf("branch made on conflict: %s", out)
	}

	// Commits the sandbox made are kept, with what it did not commit on top.
	sgit := "git -c safe.directory=* -c core.hooksPath=/dev/null -c user.name=Sand -c user.email=s@example.com"
	e.mustSh("g", fmt.Sprintf("cd %s && %s add -A && %s commit -q -m 'sandbox work' && echo later > later.txt", p, sgit, sgit))
	res, err = e.m.PromoteGit(ctx, "g", sandbox.GitPromoteOptions{Branch: "kept", KeepCommits: true})
	if err != nil || !res.Applied || len(res.Kept) != 1 || res.Parent != res.Kept[0] {
		t.Fatalf("keep commits: %v %+v", err, res)
	}
	if log := hostGit(t, p, "log", "--format=%s", "kept"); log != "changes of sandbox g not committed in it\nsandbox work\nfirst" {
		t.Fatalf("kept log %q", log)
	}
	if got := hostGit(t, p, "show", "kept:later.txt"); got != "later" {
		t.Fatalf("kept later.txt %q", got)
	}

	// A fork keeps the git base.
	kids, err := e.m.Fork(ctx, "g", sandbox.ForkOptions{N: 1})
	if err != nil || kids[0].GitBase.Commit != base {
		t.Fatalf("fork: %v %+v", err, kids)
	}

	// A hostile .git: a HEAD naming an object that is garbage, and
	// alternates pointing at the host's store. Refused; the host intact.
	e.mustSh(kids[0].Name, fmt.Sprintf("cd %s/.git && mkdir -p objects/de objects/info && echo garbage > objects/de/%s && echo %s/.git/objects > objects/info/alternates && echo de%s > refs/heads/main", p, strings.Repeat("a", 38), p, strings.Repeat("a", 38)))
	if _, err := e.m.PromoteGit(ctx, kids[0].Name, sandbox.GitPromoteOptions{Branch: "hostile", KeepCommits: true}); err == nil {
		t.Fatal("hostile .git accepted")
	}

	if m, _ := os.ReadDir(markers); len(m) != 0 {
		var names []string
		for _, x := range m {
			names = append(names, x.Name())
		}
		t.Fatalf("hooks ran: %v", names)
	}
	if s := hostGit(t, p, "status", "--porcelain"); s != status0 {
		t.Fatalf("git status changed:\n%s\nwas\n%s", s, status0)
	}
	if index, _ := os.ReadFile(filepath.Join(p, ".git", "index")); string(index) != string(index0) {
		t.Fatal("the host's index changed")
	}
	if h := hostGit(t, p, "symbolic-ref", "HEAD"); h != "refs/heads/main" {
		t.Fatalf("HEAD is %s", h)
	}
	hostGit(t, p, "-c", "core.hooksPath=/dev/null", "fsck", "--strict")
}

// hostRepo makes dir a git repository on branch main with files (path:
// content) in its first commit, ignored ones too.
func hostRepo(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	hostGit(t, dir, "init", "-q", "-b", "main")
	for f, data := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hostGit(t, dir, "add", "-A", "-f")
	hostGit(t, dir, "-c", "user.name=Host", "-c", "user.email=host@example.com", "commit", "-q", "-m", "first")
}

// TestPromoteGitRefusesHugeFile: a sparse file of over 1 GiB (no disk in
// the sandbox, a terabyte if it wanted) is refused by a git promote,
// named with its size, and the rest of the change is committed; git is
// never asked to read it whole into memory.
func TestPromoteGitRefusesHugeFile(t *testing.T) {
	e := newEnv(t, 0)
	p := e.project
	hostRepo(t, p, map[string]string{"a.txt": "a\n"})
	e.create("huge", sandbox.Limits{})
	e.mustSh("huge", fmt.Sprintf("cd %s && truncate -s 1100M huge.bin && echo b > b.txt", p))
	res, err := e.m.PromoteGit(context.Background(), "huge", sandbox.GitPromoteOptions{Branch: "b"})
	if err != nil || !res.Applied {
		t.Fatalf("promote: %v %+v", err, res)
	}
	if len(res.Refused) != 1 || res.Refused[0].Path != "huge.bin" || !strings.Contains(res.Refused[0].Reason, "1153433600 bytes") {
		t.Fatalf("refused %+v, want huge.bin with its size", res.Refused)
	}
	tree := hostGit(t, p, "ls-tree", "-r", "--name-only", "b")
	if !strings.Contains(tree, "b.txt") || strings.Contains(tree, "huge.bin") {
		t.Fatalf("branch tree:\n%s", tree)
	}
}

// TestPromoteGitNonUTF8Path: a file name that is not UTF-8 is committed
// with its exact bytes, and the change names them in path_b64, since JSON
// cannot carry them in path.
func TestPromoteGitNonUTF8Path(t *testing.T) {
	e := newEnv(t, 0)
	p := e.project
	hostRepo(t, p, map[string]string{"a.txt": "a\n"})
	e.create("odd", sandbox.Limits{})
	e.mustSh("odd", fmt.Sprintf(`cd %s && echo x > "$(printf 'x\377y')"`, p))
	res, err := e.m.PromoteGit(context.Background(), "odd", sandbox.GitPromoteOptions{Branch: "b"})
	if err != nil || !res.Applied {
		t.Fatalf("promote: %v %+v", err, res)
	}
	want := base64.StdEncoding.EncodeToString([]byte("x\xffy"))
	if len(res.Changes) != 1 || res.Changes[0].PathB64 != want || res.Changes[0].Path != "x\uFFFDy" {
		t.Fatalf("changes %+v, want one with path_b64 %s", res.Changes, want)
	}
	tree := hostGit(t, p, "-c", "core.quotepath=false", "ls-tree", "-r", "-z", "--name-only", "b")
	if !strings.Contains(tree, "x\xffy\x00") {
		t.Fatalf("branch tree %q lacks the exact name", tree)
	}
}

// TestPromoteGitRemovedDirSortsAfterSibling: a directory the sandbox
// removes leaves the branch whole, its tracked but ignored files too (the
// diff leaves those out), even when a sibling's name sorts around it
// ("a.c" after "a" but before "a/b" as bytes).
func TestPromoteGitRemovedDirSortsAfterSibling(t *testing.T) {
	e := newEnv(t, 0)
	p := e.project
	hostRepo(t, p, map[string]string{"a/b": "b", "a.c/f": "f", "a.c/x.log": "tracked though ignored", "z": "z", ".gitignore": "*.log\n"})
	e.create("rm", sandbox.Limits{})
	e.mustSh("rm", fmt.Sprintf(`cd %s && echo new > a/b && rm -r a.c`, p))
	res, err := e.m.PromoteGit(context.Background(), "rm", sandbox.GitPromoteOptions{Branch: "b"})
	if err != nil || !res.Applied {
		t.Fatalf("promote: %v %+v", err, res)
	}
	tree := hostGit(t, p, "ls-tree", "-r", "--name-only", "b")
	if want := ".gitignore\na/b\nsrc/main.txt\nz"; tree != want {
		t.Fatalf("branch tree %q, want %q", tree, want)
	}
}
