package sandbox_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/sandbox"
	"tine/sandbox/internal/cgroup"
	"tine/sandbox/ns"
)

// frozenChildEnv, when set, makes the test binary the manager process of
// TestCrashWhileFrozen: the variable holds AGENT, STORE, ROOT and PROJECT, one a line.
const frozenChildEnv = "TINE_FROZEN_CRASH_CHILD"

func init() {
	if v := os.Getenv(frozenChildEnv); v != "" {
		ns.Init()
		os.Exit(frozenChild(strings.Split(v, "\n")))
	}
}

// frozenChild opens a manager, creates sandbox "crash" with a background
// process in it, freezes its cgroup as a snapshot does, says "frozen" on
// stdout and waits to be killed.
func frozenChild(a []string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	if len(a) != 4 {
		return fail(fmt.Errorf("want 4 arguments, got %q", a))
	}
	ctx := context.Background()
	fs, err := cowfs.Open(a[1], nil)
	if err != nil {
		return fail(err)
	}
	rt, err := ns.New(a[0])
	if err != nil {
		return fail(err)
	}
	m, err := sandbox.Open(ctx, a[2], fs, sandbox.Options{Runtime: rt})
	if err != nil {
		return fail(err)
	}
	if _, err := m.Create(ctx, sandbox.CreateOptions{Name: "crash", Dir: a[3]}); err != nil {
		return fail(err)
	}
	p, err := m.Exec(ctx, "crash", proto.ExecRequest{Argv: []string{"sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo started"}})
	if err != nil {
		return fail(err)
	}
	if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 {
		return fail(fmt.Errorf("background sleep: %+v %v", ex, err))
	}
	g := cgroup.Existing(instanceID(a[2], "crash"))
	if g == nil {
		return fail(fmt.Errorf("no cgroup for sandbox crash"))
	}
	if err := g.Freeze(ctx); err != nil {
		return fail(err)
	}
	fmt.Println("frozen")
	select {}
}

// instanceID is the cgroup name a manager over state root gives sandbox
// name (sandbox.Manager's Spec.ID).
func instanceID(root, name string) string {
	abs, _ := filepath.Abs(root)
	sum := sha256.Sum256([]byte(abs))
	return "tine-" + hex.EncodeToString(sum[:4]) + "-" + name
}

// TestCrashWhileFrozen: the manager's process is killed (SIGKILL) while
// a sandbox it runs is frozen, as when it dies in the middle of a
// snapshot. Its processes cannot die frozen, so they and the frozen
// cgroup stay on the host; opening the state root again ends them,
// removes the cgroup and says so, makes the sandbox's branch again (it
// was made deferred and never committed), and the sandbox starts and runs
// commands again.
func TestCrashWhileFrozen(t *testing.T) {
	if os.Geteuid() != 0 || ns.Rootless() {
		t.Skip("cgroups need root")
	}
	base := t.TempDir()
	store, root, project := filepath.Join(base, "cowfs"), filepath.Join(base, "state"), filepath.Join(base, "project")
	os.MkdirAll(project, 0o755)
	os.WriteFile(filepath.Join(project, "f.txt"), []byte("kept\n"), 0o644)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), frozenChildEnv+"="+strings.Join([]string{agentPath, store, root, project}, "\n"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	said := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		said <- line
	}()
	select {
	case line := <-said:
		if line != "frozen\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child said %q: %s", line, stderr.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child did not freeze its sandbox in 60s: %s", stderr.String())
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	// What the crash left: the frozen cgroup with the sandbox's processes.
	id := instanceID(root, "crash")
	g := cgroup.Existing(id)
	if g == nil || !g.Frozen() {
		t.Fatalf("after the kill, cgroup %s: %+v (want it left frozen)", id, g)
	}
	left, _ := g.Pids()
	if len(left) == 0 {
		t.Fatalf("the frozen cgroup %s holds no process", id)
	}
	t.Cleanup(func() { // should the test fail before recovery
		if g := cgroup.Existing(id); g != nil {
			g.Remove(context.Background())
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fs, err := cowfs.Open(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	rt, err := ns.New(agentPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sandbox.Open(ctx, root, fs, sandbox.Options{Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	rec := strings.Join(m.Recovered(), "\n")
	if !strings.Contains(rec, `"crash"`) || !strings.Contains(rec, "frozen") {
		t.Errorf("Recovered does not tell of the frozen sandbox: %q", rec)
	}
	// Nothing committed the sandbox's branch, made deferred, before the
	// kill: it was lost and is made again from its origin (ADR 0190).
	if !strings.Contains(rec, "made it again from its origin") {
		t.Errorf("Recovered does not tell of the lost branch made again: %q", rec)
	}
	if g := cgroup.Existing(id); g != nil {
		pids, _ := g.Pids()
		t.Errorf("cgroup %s still there after Open (frozen %v, %d processes)", id, g.Frozen(), len(pids))
	}
	for _, pid := range left {
		if err := syscall.Kill(pid, 0); err == nil {
			// A zombie is dead, waiting for the host's init to reap it.
			if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); len(st) > 0 && !strings.Contains(string(st), ") Z ") {
				t.Errorf("process %d of the crashed sandbox still runs: %s", pid, st)
			}
		}
	}
	info, err := m.Get("crash")
	if err != nil || info.State != sandbox.Stopped {
		t.Fatalf("after recovery: %+v, %v (want stopped)", info, err)
	}
	if err := m.Start(ctx, "crash"); err != nil {
		t.Fatal(err)
	}
	p, err := m.Exec(ctx, "crash", proto.ExecRequest{Argv: []string{"cat", filepath.Join(project, "f.txt")}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(p.Stdout)
	if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 || string(b) != "kept\n" {
		t.Fatalf("cat after recovery: %q, %+v, %v", b, ex, err)
	}
	if g := cgroup.Existing(id); g == nil || g.Frozen() {
		t.Errorf("restarted sandbox's cgroup: %+v (want it there and not frozen)", g)
	}
}

// TestLostBranchMadeAgain: a sandbox whose branch is gone (as a crash
// leaves one made deferred and never committed) gets it back from its
// origin when the state root is opened, with its quota; one whose origin
// is gone too is reported, and the others still open.
func TestLostBranchMadeAgain(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	a := e.create("lost", sandbox.Limits{ProjectBytes: 50 << 20})
	b := e.create("gone", sandbox.Limits{})
	if err := e.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, info := range []*sandbox.Info{a, b} {
		if err := e.fs.DeleteBranch(ctx, info.Branch); err != nil {
			t.Fatal(err)
		}
	}
	// The second one's origin names nothing: no way to make it again.
	info := *b
	info.Origin = strings.Repeat("0", 63) + "1"
	j, err := json.Marshal(&info)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.root, "sandboxes", "gone", "sandbox.json"), j, 0o600); err != nil {
		t.Fatal(err)
	}
	m2, err := e.reopen(ctx)
	if err != nil {
		t.Fatalf("a sandbox that cannot get its branch back kept the others from opening: %v", err)
	}
	rec := strings.Join(m2.Recovered(), "\n")
	if !strings.Contains(rec, `sandbox "lost": its branch`) || !strings.Contains(rec, "made it again from its origin") {
		t.Errorf("Recovered does not tell of the branch made again: %q", rec)
	}
	if !strings.Contains(rec, `sandbox "gone": its branch is missing and was not made again`) {
		t.Errorf("Recovered does not tell of the branch that could not be made again: %q", rec)
	}
	if _, quota, err := e.fs.BranchUsage(ctx, a.Branch); err != nil || quota != 50<<20 {
		t.Errorf("the branch made again: quota %d (%v), want %d", quota, err, 50<<20)
	}
	if err := m2.Start(ctx, "lost"); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("lost", "cat "+filepath.Join(e.project, "src", "main.txt")); out != "v1\n" {
		t.Errorf("the project of the branch made again reads %q, want v1", out)
	}
}

// TestDamagedMetadataKeepsTheRest: a sandbox whose sandbox.json cannot be
// read (a flipped byte, a truncated write on a disk that lies) neither
// keeps the state root from opening nor hides the other sandboxes: it is
// listed damaged, says why and what to do, and can be removed. A damaged
// snapshot.json is reported when the root opens and left out of the
// lists, and the other snapshots still work. A rollback record that
// cannot be read keeps its own sandbox from starting, and only it.
func TestDamagedMetadataKeepsTheRest(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("hurt", sandbox.Limits{})
	e.create("fine", sandbox.Limits{})
	e.create("mid", sandbox.Limits{})
	hurtSnap, err := e.m.Snapshot(ctx, "fine", sandbox.SnapshotOptions{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	fineSnap, err := e.m.Snapshot(ctx, "fine", sandbox.SnapshotOptions{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	damage := func(p string) {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x20 // '{' -> '['
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	damage(filepath.Join(e.root, "sandboxes", "hurt", "sandbox.json"))
	// A damaged snapshot beside a whole one.
	damage(filepath.Join(e.root, "snapshots", hurtSnap.ID, "snapshot.json"))
	// A rollback interrupted, its record damaged.
	if err := os.WriteFile(filepath.Join(e.root, "sandboxes", "mid", "rollback.json"), []byte("[\"snapshot\":"), 0o600); err != nil {
		t.Fatal(err)
	}
	m2, err := e.reopen(ctx)
	if err != nil {
		t.Fatalf("one damaged sandbox.json kept the state root from opening: %v", err)
	}
	infos, err := m2.List()
	if err != nil {
		t.Fatalf("one damaged sandbox.json failed the list: %v", err)
	}
	states := map[string]*sandbox.Info{}
	for _, in := range infos {
		states[in.Name] = in
	}
	if h := states["hurt"]; h == nil || h.State != sandbox.Damaged || !strings.Contains(h.Problem, "tine rm hurt") {
		t.Fatalf("the damaged sandbox is listed as %+v, want damaged, saying how to remove it", h)
	}
	if f := states["fine"]; f == nil || f.State != sandbox.Stopped {
		t.Fatalf("the other sandbox is listed as %+v, want stopped", f)
	}
	if err := m2.Start(ctx, "mid"); err == nil || !strings.Contains(err.Error(), "rollback of it did not finish") {
		t.Fatalf("start of the sandbox whose rollback record is damaged: %v, want refused", err)
	}
	if rec := strings.Join(m2.Recovered(), "\n"); !strings.Contains(rec, `sandbox "mid": interrupted rollback`) {
		t.Errorf("Recovered does not tell of the damaged rollback record: %q", rec)
	}
	if err := m2.Start(ctx, "hurt"); !errors.Is(err, sandbox.ErrDamaged) {
		t.Fatalf("start of the damaged sandbox: %v, want ErrDamaged", err)
	}
	if err := m2.Start(ctx, "fine"); err != nil {
		t.Fatal(err)
	}
	e.mustSh("fine", "true")
	if snaps, err := m2.Snapshots("fine"); err != nil || len(snaps) != 1 || snaps[0].ID != fineSnap.ID {
		t.Fatalf("snapshots beside a damaged one: %v (%v), want the whole one alone", snaps, err)
	}
	if err := m2.Rollback(ctx, "fine", "b"); err != nil {
		t.Fatalf("rollback beside a damaged snapshot: %v", err)
	}
	if rec := strings.Join(m2.Recovered(), "\n"); !strings.Contains(rec, "snapshot "+hurtSnap.ID+": ") {
		t.Errorf("Recovered does not tell of the damaged snapshot: %q", rec)
	}
	if err := m2.Remove(ctx, "hurt"); err != nil {
		t.Fatalf("remove the damaged sandbox: %v", err)
	}
	if infos, err := m2.List(); err != nil || len(infos) != 2 || infos[0].Name != "fine" || infos[1].Name != "mid" {
		t.Fatalf("after removing it the list is %v (%v), want fine and mid", infos, err)
	}
}
