package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// verifyCheck is a project's test: every NAME.use file names a word that
// api.txt must hold.
const verifyCheck = `for f in *.use; do w=$(cat $f); grep -qx "$w" api.txt || { echo "missing $w used by $f"; exit 1; }; echo "ok $f"; done`

// TestPromoteVerify: the check runs on the origin as it is now with the
// sandbox's changes applied (a host file the sandbox never saw breaks
// it), a failing check writes nothing and is recorded with its output
// and exit code, a passing one promotes; the verification sandbox gets a
// fresh OS layer (not the promoted sandbox's) and is removed unless kept.
func TestPromoteVerify(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	p := e.project
	os.WriteFile(filepath.Join(p, "api.txt"), []byte("greet\n"), 0o644)
	os.WriteFile(filepath.Join(p, "a.use"), []byte("greet\n"), 0o644)
	os.WriteFile(filepath.Join(p, "check.sh"), []byte(verifyCheck+"\n"), 0o755)
	e.create("v", sandbox.Limits{})
	// The sandbox renames the word and its one user, and leaves a mark
	// outside the project that a check run in it would see.
	e.mustSh("v", "cd "+p+" && echo hello > api.txt && echo hello > a.use && sh check.sh && touch /sandbox-os-mark")
	check := "test ! -e /sandbox-os-mark && sh check.sh"

	// The host did not move: the check passes (dry run: nothing written).
	res, err := e.m.Promote(ctx, "v", sandbox.PromoteOptions{Verify: sandbox.VerifyOptions{Command: check}, PromoteOptions: cowfs.PromoteOptions{DryRun: true}})
	if err != nil || res.Verify == nil || !res.Verify.Passed || res.Verify.ExitCode != 0 || !strings.Contains(res.Verify.Output, "ok a.use") {
		t.Fatalf("unmoved host: %v %+v", err, res.Verify)
	}
	// The host gains a user of the old word: the sandbox's change alone
	// passes, merged with the host it does not.
	os.WriteFile(filepath.Join(p, "b.use"), []byte("greet\n"), 0o644)
	res, err = e.m.Promote(ctx, "v", sandbox.PromoteOptions{Verify: sandbox.VerifyOptions{Command: check}})
	if !errors.Is(err, sandbox.ErrVerifyFailed) || !strings.Contains(err.Error(), check) || res.Verify == nil || res.Verify.Passed || res.Verify.ExitCode != 1 {
		t.Fatalf("moved host: %v %+v", err, res.Verify)
	}
	if !strings.Contains(res.Verify.Output, "missing greet used by b.use") {
		t.Fatalf("output %q", res.Verify.Output)
	}
	if b, _ := os.ReadFile(filepath.Join(p, "api.txt")); string(b) != "greet\n" {
		t.Fatalf("written despite the failed check: api.txt %q", b)
	}
	recs, err := e.m.PromoteRecords("v")
	if err != nil || len(recs) != 2 || recs[1].Applied || recs[1].Verify.ExitCode != 1 || !strings.Contains(recs[1].Verify.Output, "b.use") || recs[1].Error == "" || recs[1].Path != res.Record {
		t.Fatalf("records %v %+v", err, recs)
	}
	// The host fixes its user: the check passes and the promotion writes.
	os.WriteFile(filepath.Join(p, "b.use"), []byte("hello\n"), 0o644)
	res, err = e.m.Promote(ctx, "v", sandbox.PromoteOptions{Verify: sandbox.VerifyOptions{Command: check, Keep: true}})
	if err != nil || !res.Applied || !res.Verify.Passed || !strings.Contains(res.Verify.Output, "ok b.use") || res.Verify.Sandbox == "" {
		t.Fatalf("fixed host: %v %+v", err, res.Verify)
	}
	if b, _ := os.ReadFile(filepath.Join(p, "api.txt")); string(b) != "hello\n" {
		t.Fatalf("api.txt %q", b)
	}
	// The kept verification sandbox holds the merged tree; the others
	// are gone.
	if out := e.mustSh(res.Verify.Sandbox, "cat "+p+"/b.use "+p+"/api.txt"); out != "hello\nhello\n" {
		t.Fatalf("kept sandbox: %q", out)
	}
	infos, _ := e.m.List()
	var verifiers []string
	for _, in := range infos {
		if strings.Contains(in.Name, ".verify-") {
			verifiers = append(verifiers, in.Name)
		}
	}
	if len(verifiers) != 1 || verifiers[0] != res.Verify.Sandbox {
		t.Fatalf("verification sandboxes left: %v", verifiers)
	}
	// Output is bounded: the end is kept.
	e.mustSh("v", "cd "+p+" && echo more > c.use")
	res, _ = e.m.Promote(ctx, "v", sandbox.PromoteOptions{Verify: sandbox.VerifyOptions{Command: "head -c 200000 /dev/zero | tr '\\0' x; echo; echo the-end; exit 3"}})
	if v := res.Verify; v == nil || v.ExitCode != 3 || !v.Truncated || v.OutputBytes != 200009 || len(v.Output) != sandbox.VerifyOutputMax || !strings.HasSuffix(v.Output, "the-end\n") {
		t.Fatalf("long output: %+v", res.Verify)
	}
}

// TestPromoteVerifyGit: a verified promotion to a git branch checks a
// clean checkout of the commit (with --onto HEAD, the host's HEAD as it
// is now); a failing check makes no branch and runs no hook.
func TestPromoteVerifyGit(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	p := e.project
	markers := filepath.Join(filepath.Dir(p), "markers")
	os.WriteFile(filepath.Join(p, "api.txt"), []byte("greet\n"), 0o644)
	os.WriteFile(filepath.Join(p, "a.use"), []byte("greet\n"), 0o644)
	os.WriteFile(filepath.Join(p, "check.sh"), []byte(verifyCheck+"\n"), 0o755)
	gitRepoWithHooks(t, p, markers)
	e.create("g", sandbox.Limits{})
	e.mustSh("g", "cd "+p+" && echo hello > api.txt && echo hello > a.use && echo junk > x.log")
	// The host commits a new user of the old word, and leaves an
	// uncommitted file and an ignored one.
	os.WriteFile(filepath.Join(p, "b.use"), []byte("greet\n"), 0o644)
	hostGit(t, p, "add", "b.use")
	hostCommit(t, p, "b")
	os.WriteFile(filepath.Join(p, "untracked.use"), []byte("nothing\n"), 0o644)
	status := hostGit(t, p, "status", "--porcelain")
	check := "test ! -e .git && test ! -e x.log && test ! -e untracked.use && sh check.sh"

	// Without --onto the commit's parent is the base: the check passes.
	res, err := e.m.PromoteGit(ctx, "g", sandbox.GitPromoteOptions{Branch: "base-ok", Verify: sandbox.VerifyOptions{Command: check}, DryRun: true})
	if err != nil || res.Verify == nil || !res.Verify.Passed || res.Applied {
		t.Fatalf("on the base: %v %+v", err, res)
	}
	// Onto HEAD: the host's new user breaks it; no branch.
	res, err = e.m.PromoteGit(ctx, "g", sandbox.GitPromoteOptions{Branch: "onto", Onto: "HEAD", Verify: sandbox.VerifyOptions{Command: check}})
	if !errors.Is(err, sandbox.ErrVerifyFailed) || res.Applied || res.Verify.ExitCode != 1 || !strings.Contains(res.Verify.Output, "missing greet used by b.use") || res.Record == "" {
		t.Fatalf("onto HEAD: %v %+v", err, res)
	}
	if out := hostGit(t, p, "branch", "--list", "onto"); out != "" {
		t.Fatalf("branch made despite the failed check: %q", out)
	}
	// The host fixes its user in a commit: the check passes, the branch is made.
	os.WriteFile(filepath.Join(p, "b.use"), []byte("hello\n"), 0o644)
	hostCommit(t, p, "b uses hello")
	status = hostGit(t, p, "status", "--porcelain")
	res, err = e.m.PromoteGit(ctx, "g", sandbox.GitPromoteOptions{Branch: "onto", Onto: "HEAD", Verify: sandbox.VerifyOptions{Command: check}})
	if err != nil || !res.Applied || !res.Verify.Passed {
		t.Fatalf("fixed: %v %+v", err, res)
	}
	if got := hostGit(t, p, "show", "onto:api.txt"); got != "hello" {
		t.Fatalf("onto:api.txt %q", got)
	}
	if m, _ := os.ReadDir(markers); len(m) != 0 {
		t.Fatalf("hooks ran: %v", m)
	}
	if s := hostGit(t, p, "status", "--porcelain"); s != status {
		t.Fatalf("git status changed: %q, was %q", s, status)
	}
	hostGit(t, p, "fsck", "--strict")
}

// TestPromoteVerifyOOM: a check killed by the memory limit it inherits
// fails with killed_by oom in its result and error, not a bare signal.
func TestPromoteVerifyOOM(t *testing.T) {
	e := newEnv(t, 0)
	e.create("m", sandbox.Limits{LimitsExt: sandbox.LimitsExt{MemoryBytes: 64 << 20}})
	hog := `x=$(head -c 150000000 /dev/zero | tr '\0' a); echo ${#x}`
	res, err := e.m.Promote(context.Background(), "m", sandbox.PromoteOptions{Verify: sandbox.VerifyOptions{Command: hog},
		PromoteOptions: cowfs.PromoteOptions{DryRun: true}})
	v := res.Verify
	if !errors.Is(err, sandbox.ErrVerifyFailed) || v == nil || v.Passed || v.KilledBy != proto.KilledOOM || !strings.Contains(v.KilledReason, "64 MiB") {
		t.Fatalf("check over the memory limit: %v %+v; want a failed check with killed_by oom", err, v)
	}
	if !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("error %q does not say out of memory", err)
	}
}
