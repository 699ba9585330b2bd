package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// GitBase is the commit a sandbox's host directory had checked out when
// the sandbox was made, and the cowfs snapshot of the directory then.
type GitBase struct {
	// Commit is HEAD's commit id.
	Commit string `json:"commit"`
	// FS is the cowfs snapshot the directory was imported as.
	FS string `json:"fs"`
	// Branch is the branch name a promotion with no name of its own goes
	// to (set by a fork with a branch template).
	Branch string `json:"branch,omitempty"`
}

// gitBaseOf returns the GitBase of host directory dir imported as snapshot
// fs: empty unless dir is the top of a git work tree whose HEAD names a
// commit. One git process answers both questions.
func gitBaseOf(dir, fs string) GitBase {
	g := &gitRepo{dir: dir}
	out, err := g.out(context.Background(), nil, "rev-parse", "--show-toplevel", "--verify", "-q", "HEAD^{commit}")
	top, head, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err != nil || !isCommitID(head) {
		return GitBase{}
	}
	a, err1 := filepath.EvalSymlinks(top)
	b, err2 := filepath.EvalSymlinks(dir)
	if err1 != nil || err2 != nil || a != b {
		return GitBase{}
	}
	return GitBase{Commit: head, FS: fs}
}

// isCommitID says whether s is a full hex object id (SHA-1 or SHA-256).
func isCommitID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// gitBases remembers the GitBase of each (directory, import snapshot):
// when a directory's .git is a directory inside it, its HEAD is part of
// what the snapshot holds, so the same snapshot means the same HEAD and
// a create from an unchanged project runs no git. A .git file (a linked
// work tree, whose HEAD lives elsewhere) is never cached. A directory
// with no .git of its own runs no git either: it is no work tree's top
// (git would find a parent's repository, or none).
type gitBases struct {
	mu sync.Mutex
	m  map[[2]string]GitBase
}

// maxGitBases bounds the cache; it is emptied when full.
const maxGitBases = 1024

// of returns the GitBase of dir imported as snapshot snap.
func (c *gitBases) of(dir, snap string) GitBase {
	key := [2]string{dir, snap}
	c.mu.Lock()
	b, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return b
	}
	st, err := os.Lstat(filepath.Join(dir, ".git"))
	if errors.Is(err, fs.ErrNotExist) {
		return GitBase{}
	}
	b = gitBaseOf(dir, snap)
	if err != nil || !st.IsDir() {
		return b
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxGitBases {
		c.m = map[[2]string]GitBase{}
	}
	c.m[key] = b
	c.mu.Unlock()
	return b
}

// gitRepo runs git plumbing on one repository with every way git has of
// running a program of the repository's choosing turned off: no hooks
// (core.hooksPath=/dev/null wins over any configured path), no fsmonitor,
// no filters (objects are hashed with --no-filters), no signing, no
// optional lock-taking index refresh; the caller's GIT_* variables are
// dropped so that none points git elsewhere.
type gitRepo struct {
	dir string
	// index is the temporary index file, if any (GIT_INDEX_FILE).
	index string
	// env is added to the environment (author and committer).
	env []string
}

var gitSafety = []string{"-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
	"-c", "core.untrackedCache=false", "-c", "commit.gpgSign=false", "-c", "safe.directory=*",
	"-c", "gc.auto=0", "-c", "maintenance.auto=false", "-c", "core.sshCommand=false"}

// cmd is a git command on g with the safety settings.
func (g *gitRepo) cmd(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, "git", append(append(append([]string{}, gitSafety...), "-C", g.dir), args...)...)
	env := []string{"GIT_TERMINAL_PROMPT=0", "GIT_OPTIONAL_LOCKS=0", "GIT_NO_REPLACE_OBJECTS=1"}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GIT_") {
			env = append(env, e)
		}
	}
	if g.index != "" {
		env = append(env, "GIT_INDEX_FILE="+g.index)
	}
	c.Env = append(env, g.env...)
	return c
}

// out runs git with stdin and returns its standard output.
func (g *gitRepo) out(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	c := g.cmd(ctx, args...)
	c.Stdin = stdin
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &limitBuf{b: &e, n: 8 << 10}
	if err := c.Run(); err != nil {
		return o.Bytes(), fmt.Errorf("git %s in %s: %v: %s", args[0], g.dir, err, strings.TrimSpace(e.String()))
	}
	return o.Bytes(), nil
}

// line runs git and returns its output's first line.
func (g *gitRepo) line(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	o, err := g.out(ctx, stdin, args...)
	s, _, _ := strings.Cut(string(o), "\n")
	return s, err
}

// rev resolves rev to a commit id.
func (g *gitRepo) rev(ctx context.Context, rev string) (string, error) {
	if strings.HasPrefix(rev, "-") {
		return "", fmt.Errorf("bad revision %q", rev)
	}
	return g.line(ctx, nil, "rev-parse", "--verify", "-q", rev+"^{commit}")
}

// limitBuf keeps the first n bytes written to it.
type limitBuf struct {
	b *bytes.Buffer
	n int
}

func (l *limitBuf) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
