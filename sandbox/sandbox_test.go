package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/internal/testagent"
	"tine/sandbox"
	"tine/sandbox/ns"
)

var agentPath string

func TestMain(m *testing.M) {
	testagent.Main(m, &agentPath)
}

// env is one test's manager over a fresh cowfs root and project directory.
type env struct {
	t       testing.TB
	rt      *ns.Runtime
	m       *sandbox.Manager
	fs      *cowfs.FS
	root    string
	project string
}

func newEnv(t testing.TB, pool int) *env {
	t.Helper()
	return newEnvWith(t, sandbox.Options{MountPool: pool})
}

// newEnvWith is newEnv with the manager's options (its Runtime is set
// here); with o.Warm it waits until the warm sandboxes are started.
func newEnvWith(t testing.TB, o sandbox.Options) *env {
	t.Helper()
	return newEnvFS(t, o, nil)
}

// newEnvFS is newEnvWith with the file system's options.
func newEnvFS(t testing.TB, o sandbox.Options, fo *cowfs.Options) *env {
	t.Helper()
	base := t.TempDir()
	project := filepath.Join(base, "project")
	if err := os.MkdirAll(filepath.Join(project, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(project, "src", "main.txt"), []byte("v1\n"), 0o644)
	fs, err := cowfs.Open(filepath.Join(base, "cowfs"), fo)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := ns.New(agentPath)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, rt: rt, fs: fs, root: filepath.Join(base, "state"), project: project}
	o.Runtime = rt
	e.m, err = sandbox.Open(context.Background(), e.root, fs, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.m.Close(context.Background()); err != nil {
			t.Error(err)
		}
		if err := fs.Close(); err != nil {
			t.Error(err)
		}
	})
	if o.Warm > 0 {
		e.waitWarm(o.Warm)
	}
	return e
}

// waitWarm waits until n warm sandboxes are ready.
func (e *env) waitWarm(n int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.rt.WaitWarm(ctx, n); err != nil {
		e.t.Fatal(err)
	}
}

// reopen opens a new manager, with a new ns runtime, over the state root
// (as a daemon starting again does) and makes it e's.
func (e *env) reopen(ctx context.Context) (*sandbox.Manager, error) {
	e.t.Helper()
	rt, err := ns.New(agentPath)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := sandbox.Open(ctx, e.root, e.fs, sandbox.Options{Runtime: rt})
	if err == nil {
		e.m = m
	}
	return m, err
}

func (e *env) create(name string, lim sandbox.Limits) *sandbox.Info {
	e.t.Helper()
	info, err := e.m.Create(context.Background(), sandbox.CreateOptions{Name: name, Dir: e.project, Limits: lim})
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

// sh runs a shell command in sandbox name and returns stdout+stderr and
// the exit code.
func (e *env) sh(name, script string) (string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := e.m.Exec(ctx, name, proto.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err != nil {
		e.t.Fatal(err)
	}
	var errb bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&errb, p.Stderr); close(done) }()
	out, _ := io.ReadAll(p.Stdout)
	<-done
	ex, err := p.Wait(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(out) + errb.String(), ex.Code
}

func (e *env) mustSh(name, script string) string {
	e.t.Helper()
	out, code := e.sh(name, script)
	if code != 0 {
		e.t.Fatalf("%s: %q exited %d: %s", name, script, code, out)
	}
	return out
}

// TestCreateExecIsolateDiffRemove: a command answers; writes to /etc and
// to the project land in the sandbox only; Diff lists the project change;
// Remove leaves no mount, cgroup or directory behind.
func TestCreateExecIsolateDiffRemove(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("one", sandbox.Limits{Pids: 100})
	if out := e.mustSh("one", "echo hi"); out != "hi\n" {
		t.Fatalf("echo hi: %q", out)
	}
	hostEtc := "/etc/tine-sandbox-test-x"
	os.Remove(hostEtc)
	e.mustSh("one", fmt.Sprintf("echo sandbox > %s && echo changed > %s/src/main.txt && echo new > %s/added.txt",
		hostEtc, e.project, e.project))
	if out := e.mustSh("one", "cat "+hostEtc+" "+e.project+"/src/main.txt"); out != "sandbox\nchanged\n" {
		t.Fatalf("inside: %q", out)
	}
	if _, err := os.Stat(hostEtc); err == nil {
		os.Remove(hostEtc)
		t.Fatal("a write to /etc in the sandbox reached the host")
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "src", "main.txt")); string(b) != "v1\n" {
		t.Fatalf("host project changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(e.project, "added.txt")); err == nil {
		t.Fatal("a file added in the sandbox's project reached the host")
	}
	changes, err := e.m.Diff(ctx, "one", "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.Kind.String()+" "+c.Path)
	}
	if want := "added added.txt,modified src/main.txt"; strings.Join(got, ",") != want {
		t.Fatalf("diff = %q, want %q", got, want)
	}
	if err := e.m.Remove(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Get("one"); err == nil {
		t.Fatal("Get after Remove succeeded")
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), e.root) {
		t.Fatalf("a mount under the state root is left:\n%s", mi)
	}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/tine/tine-*-one")
	if len(cg) > 0 {
		t.Fatalf("cgroups left: %v", cg)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.root, "sandboxes")); len(ents) != 0 {
		t.Fatalf("sandbox directories left: %v", ents)
	}
}

// TestForkDiverges: three forks of a running sandbox each see its files
// as they were at the fork, in the project and in the OS layer, and then
// change independently of it and of each other.
func TestForkDiverges(t *testing.T) {
	forkDiverges(t, newEnv(t, 2), false)
}

// TestForkDivergesWarm is TestForkDiverges with the forks made from warm
// sandboxes, whose root is rebuilt over the snapshot's layer.
func TestForkDivergesWarm(t *testing.T) {
	forkDiverges(t, newEnvWith(t, sandbox.Options{Warm: 3}), true)
}

func forkDiverges(t *testing.T, e *env, warm bool) {
	ctx := context.Background()
	e.create("p", sandbox.Limits{})
	e.mustSh("p", fmt.Sprintf("echo parent > %s/state.txt; echo parent > /etc/tine-fork-state; sleep 1000 & true", e.project))
	if warm {
		e.waitWarm(3)
	}
	bound := e.rt.WarmBound()
	kids, err := e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 3})
	if err != nil {
		t.Fatal(err)
	}
	if warm && e.rt.WarmBound() != bound+3 {
		t.Fatalf("%d of 3 forks took a warm sandbox", e.rt.WarmBound()-bound)
	}
	e.mustSh("p", fmt.Sprintf("echo later > %s/state.txt; echo later > /etc/tine-fork-state", e.project))
	for i, k := range kids {
		if k.ForkedFrom != "p" {
			t.Fatalf("%s: ForkedFrom %q", k.Name, k.ForkedFrom)
		}
		if out := e.mustSh(k.Name, fmt.Sprintf("cat %s/state.txt /etc/tine-fork-state", e.project)); out != "parent\nparent\n" {
			t.Fatalf("%s sees %q, want the parent's files at the fork", k.Name, out)
		}
		e.mustSh(k.Name, fmt.Sprintf("echo kid%d > %s/state.txt; echo kid%d > /etc/tine-fork-state", i, e.project, i))
	}
	for i, k := range kids {
		want := fmt.Sprintf("kid%d\nkid%d\n", i, i)
		if out := e.mustSh(k.Name, fmt.Sprintf("cat %s/state.txt /etc/tine-fork-state", e.project)); out != want {
			t.Fatalf("%s: %q, want %q", k.Name, out, want)
		}
		if out := e.mustSh(k.Name, "ps -e -o comm= | grep -c sleep || true"); strings.TrimSpace(out) != "0" {
			t.Fatalf("%s runs the parent's processes: %q", k.Name, out)
		}
	}
	if out := e.mustSh("p", fmt.Sprintf("cat %s/state.txt /etc/tine-fork-state", e.project)); out != "later\nlater\n" {
		t.Fatalf("parent: %q", out)
	}
}

// TestForkNameClashLeavesNothing: a fork whose names include an existing
// sandbox fails before starting any, leaves no branch or sandbox of the
// other names (they can be made afterwards) and leaves the existing one
// running with its files. Forks named by default number on after the
// highest fork that exists, so forking again never clashes.
func TestForkNameClashLeavesNothing(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("p", sandbox.Limits{})
	e.create("p-2", sandbox.Limits{})
	e.mustSh("p-2", fmt.Sprintf("echo mine > %s/own.txt", e.project))
	if _, err := e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 3, Names: []string{"p-1", "p-2", "p-3"}}); err == nil {
		t.Fatal("a fork into a name that exists succeeded")
	} else if !strings.Contains(err.Error(), "p-2") {
		t.Errorf("the error does not name the clash: %v", err)
	}
	for _, n := range []string{"p-1", "p-3"} {
		if _, err := e.m.Get(n); err == nil {
			t.Errorf("sandbox %s exists after the failed fork", n)
		}
	}
	if out := e.mustSh("p-2", fmt.Sprintf("cat %s/own.txt", e.project)); out != "mine\n" {
		t.Errorf("the existing sandbox after the failed fork: %q", out)
	}
	kids, err := e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 2, Names: []string{"p-1", "p-3"}})
	if err != nil {
		t.Fatalf("the names left free by the failed fork: %v", err)
	}
	if len(kids) != 2 {
		t.Fatalf("%d forks", len(kids))
	}
	e.create("p-x", sandbox.Limits{})
	e.create("p-07", sandbox.Limits{})
	if got, err := e.m.ForkNames("p", sandbox.ForkOptions{N: 2}); err != nil || strings.Join(got, " ") != "p-4 p-5" {
		t.Fatalf("default names after p-1, p-2, p-3, p-x and p-07: %v, %v; want p-4 p-5", got, err)
	}
	kids, err = e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 1})
	if err != nil || kids[0].Name != "p-4" {
		t.Fatalf("a fork with default names after p-1..p-3: %v, want p-4", err)
	}
}

// TestRollbackAndRestart: Rollback restores the project and the OS layer
// of a snapshot; a new manager on the same state root finds the sandbox
// stopped, and Start runs it with its files.
func TestRollbackAndRestart(t *testing.T) {
	for _, warm := range []int{0, 2} {
		t.Run(fmt.Sprintf("warm=%d", warm), func(t *testing.T) { testRollbackAndRestart(t, warm) })
	}
}

// testRollbackAndRestart: a running sandbox rolled back runs again with
// the snapshot's files, in the project and in its OS layer, with warm
// instances ready or none; so does a stopped one once started, and both
// survive the manager's restart.
func testRollbackAndRestart(t *testing.T, warm int) {
	e := newEnvWith(t, sandbox.Options{Warm: warm})
	ctx := context.Background()
	e.create("r", sandbox.Limits{})
	e.mustSh("r", fmt.Sprintf("echo one > %s/f; echo one > /etc/tine-rb", e.project))
	s, err := e.m.Snapshot(ctx, "r", sandbox.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.mustSh("r", fmt.Sprintf("echo two > %s/f; echo two > /etc/tine-rb", e.project))
	if warm > 0 {
		e.waitWarm(warm)
	}
	if err := e.m.Rollback(ctx, "r", s.ID); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("r", fmt.Sprintf("cat %s/f /etc/tine-rb", e.project)); out != "one\none\n" {
		t.Fatalf("after rollback: %q", out)
	}
	e.mustSh("r", fmt.Sprintf("echo three > %s/f; echo three > /etc/tine-rb", e.project))
	if err := e.m.Stop(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Rollback(ctx, "r", s.ID); err != nil {
		t.Fatal(err)
	}
	if info, err := e.m.Get("r"); err != nil || info.State != sandbox.Stopped {
		t.Fatalf("a stopped sandbox after rollback: %+v, %v", info, err)
	}
	if err := e.m.Start(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("r", fmt.Sprintf("cat %s/f /etc/tine-rb", e.project)); out != "one\none\n" {
		t.Fatalf("a stopped sandbox rolled back, then started: %q", out)
	}
	if err := e.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m2, err := e.reopen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := m2.Get("r")
	if err != nil || info.State != sandbox.Stopped {
		t.Fatalf("after reopen: %+v, %v", info, err)
	}
	if err := m2.Start(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("r", fmt.Sprintf("cat %s/f /etc/tine-rb", e.project)); out != "one\none\n" {
		t.Fatalf("after restart: %q", out)
	}
}

// TestUnreadOutputHoldsOnlyItsCommand: a command whose output nobody
// reads (more than every buffer between it and the caller) holds back
// that command only; the sandbox's other commands and requests answer.
func TestUnreadOutputHoldsOnlyItsCommand(t *testing.T) {
	e := newEnv(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "loud", Dir: e.project}); err != nil {
		t.Fatal(err)
	}
	// 16 MiB of output, never read while the rest runs.
	loud, err := e.m.Exec(ctx, "loud", proto.ExecRequest{Argv: []string{"sh", "-c", "head -c 16777216 /dev/zero"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // let the output fill what it can
	for i := 0; i < 3; i++ {
		short, stop := context.WithTimeout(ctx, 10*time.Second)
		p, err := e.m.Exec(short, "loud", proto.ExecRequest{Argv: []string{"echo", "quiet"}})
		if err != nil {
			stop()
			t.Fatalf("exec %d beside a command whose output is unread: %v", i, err)
		}
		out, _ := io.ReadAll(p.Stdout)
		x, err := p.Wait(short)
		stop()
		if err != nil || x.Code != 0 || string(out) != "quiet\n" {
			t.Fatalf("exec %d beside a command whose output is unread: %q %+v %v", i, out, x, err)
		}
	}
	c, err := e.m.Agent(ctx, "loud")
	if err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if _, err := c.Ps(short); err != nil {
		t.Fatalf("ps beside a command whose output is unread: %v", err)
	}
	// The loud command still delivers all of its output once read.
	n, _ := io.Copy(io.Discard, loud.Stdout)
	if x, err := loud.Wait(ctx); err != nil || x.Code != 0 || n != 16<<20 {
		t.Fatalf("the unread command: %d bytes, %+v %v", n, x, err)
	}
}

// TestAgentConnectionsReusedAndClosed: commands that ended leave their
// agent connections for later commands, at most a few per sandbox, and
// removing the sandbox closes them all.
func TestAgentConnectionsReusedAndClosed(t *testing.T) {
	e := newEnv(t, 0)
	sockets := func() int {
		n := 0
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, d := range ents {
			if l, err := os.Readlink(filepath.Join("/proc/self/fd", d.Name())); err == nil && strings.HasPrefix(l, "socket:") {
				n++
			}
		}
		return n
	}
	before := sockets()
	e.create("conns", sandbox.Limits{})
	var wg sync.WaitGroup
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); e.mustSh("conns", "sleep 0.3") }()
	}
	wg.Wait()
	for i := 0; i < 10; i++ {
		if out := e.mustSh("conns", "echo again"); out != "again\n" {
			t.Fatalf("command %d on a kept connection: %q", i, out)
		}
	}
	// The last exit reaches the caller just before its connection is kept.
	deadline := time.Now().Add(5 * time.Second)
	for sockets() > before+4+2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := sockets() - before; got > 4+2 {
		t.Errorf("%d sockets open after 12 commands at once ended, want at most 4 kept connections and the sandbox's own", got)
	}
	if err := e.m.Remove(context.Background(), "conns"); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for sockets() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := sockets(); got > before {
		t.Errorf("%d sockets open after the sandbox was removed, %d before it was made", got, before)
	}
}

// TestForkStacksLayers: a fork's OS layer is its snapshot's, stacked:
// what the parent wrote and deleted outside the project shows in the
// fork and in a fork of that fork, which stacks one merged layer, also
// once the parent and its snapshots are removed, after a restart, and
// after a rollback of the middle fork to its own snapshot.
func TestForkStacksLayers(t *testing.T) {
	for _, warm := range []int{0, 2} {
		t.Run(fmt.Sprintf("warm=%d", warm), func(t *testing.T) { testForkStacksLayers(t, warm) })
	}
}

func testForkStacksLayers(t *testing.T, warm int) {
	e := newEnvWith(t, sandbox.Options{Warm: warm})
	ctx := context.Background()
	e.create("a", sandbox.Limits{})
	e.mustSh("a", "echo a > /etc/tine-a; rm /etc/os-release; mkdir -p /opt/tine /opt/tine-del && echo a > /opt/tine/f && echo x > /opt/tine-del/x")
	fork := func(from, to string) {
		t.Helper()
		if warm > 0 {
			e.waitWarm(warm)
		}
		if _, err := e.m.Fork(ctx, from, sandbox.ForkOptions{N: 1, Names: []string{to}}); err != nil {
			t.Fatal(err)
		}
	}
	fork("a", "b")
	e.mustSh("b", "cat /etc/tine-a && test ! -e /etc/os-release && echo b > /etc/tine-b && rm /etc/tine-a /opt/tine-del/x && rm -r /opt/tine && mkdir /opt/tine && echo b > /opt/tine/g")
	// /opt/tine-del, not on the host, is listed empty: a deletion in a
	// directory the host does not have leaves no name behind.
	const view = "cat /etc/tine-b /opt/tine/g; ls /opt/tine; ls -A /opt/tine-del; for f in /etc/tine-a /etc/os-release; do test -e $f && echo $f; done; true"
	const want = "b\nb\ng\n"
	snapB, err := e.m.Snapshot(ctx, "b", sandbox.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fork("b", "c")
	if out := e.mustSh("c", view); out != want {
		t.Fatalf("the fork of a fork sees %q, want %q", out, want)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "sandboxes", "c", "runtime", "lower", "etc", "tine-b")); err != nil {
		t.Errorf("the fork's stacked layer: %v", err)
	}
	snaps, err := e.m.Snapshots("a")
	if err != nil || len(snaps) == 0 {
		t.Fatalf("the parent's snapshots: %v, %v", snaps, err)
	}
	if err := e.m.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		if err := e.m.RemoveSnapshot(s.ID); err != nil {
			t.Fatal(err)
		}
	}
	if out := e.mustSh("c", view); out != want {
		t.Fatalf("with the parent and its snapshots removed, the fork of a fork sees %q, want %q", out, want)
	}
	if err := e.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := e.reopen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b", "c"} {
		if err := m.Start(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if out := e.mustSh("c", view); out != want {
		t.Fatalf("after a restart, the fork of a fork sees %q, want %q", out, want)
	}
	e.mustSh("b", "echo later > /etc/tine-b; rm /opt/tine/g; echo a > /etc/tine-a")
	if err := m.Rollback(ctx, "b", snapB.ID); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("b", view); out != want {
		t.Fatalf("the fork rolled back to its snapshot sees %q, want %q", out, want)
	}
}

// TestForksShareLayer: the forks of one snapshot, bound from warm
// sandboxes or started cold once none is left (or with none kept),
// stack one shared layer (ADR 0215), kept while a fork refers to it, the
// snapshot removed included, and removed with the last reference: a
// rollback's or a removal's.
func TestForksShareLayer(t *testing.T) {
	for _, warm := range []int{0, 2} {
		t.Run(fmt.Sprintf("warm=%d", warm), func(t *testing.T) { testForksShareLayer(t, warm) })
	}
}

func testForksShareLayer(t *testing.T, warm int) {
	e := newEnvWith(t, sandbox.Options{Warm: warm})
	ctx := context.Background()
	e.create("a", sandbox.Limits{})
	e.mustSh("a", "echo a > /etc/tine-a; rm /etc/os-release")
	snap, err := e.m.Snapshot(ctx, "a", sandbox.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if warm > 0 {
		e.waitWarm(warm)
	}
	bound := e.rt.WarmBound()
	kids := []string{"k1", "k2", "k3"}
	if _, err := e.m.Fork(ctx, "a", sandbox.ForkOptions{N: 3, Names: kids}); err != nil {
		t.Fatal(err)
	}
	layers := filepath.Join(e.root, "layers")
	shared := func() []string {
		t.Helper()
		ents, err := os.ReadDir(layers)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range ents {
			out = append(out, d.Name())
		}
		return out
	}
	if n := e.rt.WarmBound() - bound; n != warm {
		t.Errorf("%d of the 3 forks were bound from warm sandboxes, want %d (the rest started cold)", n, warm)
	}
	if got := shared(); len(got) != 1 {
		t.Fatalf("3 forks of one snapshot: shared layers %v, want one", got)
	}
	var target string
	for _, k := range kids {
		l, err := os.Readlink(filepath.Join(e.root, "sandboxes", k, "runtime", "lower"))
		if err != nil {
			t.Fatalf("fork %s's stacked layer is not the shared one: %v", k, err)
		}
		if target != "" && l != target {
			t.Errorf("fork %s stacks %s, another %s", k, l, target)
		}
		target = l
		if out := e.mustSh(k, "cat /etc/tine-a; test -e /etc/os-release && echo os-release; true"); out != "a\n" {
			t.Errorf("fork %s sees %q, want the parent's files", k, out)
		}
	}
	ref := filepath.Join(layers, shared()[0], "ref")
	links := func() uint64 {
		t.Helper()
		st, err := os.Stat(ref)
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Nlink
	}
	if n := links(); n != 4 {
		t.Errorf("the shared layer's ref has %d links, want 4 (its own and 3 forks')", n)
	}
	e.mustSh("k1", "echo k1 > /etc/tine-a")
	if out := e.mustSh("k2", "cat /etc/tine-a"); out != "a\n" {
		t.Errorf("a fork's write showed in its sibling: %q", out)
	}
	// Removing the parent and its snapshots, then two of the forks,
	// keeps the layer of the last one.
	if err := e.m.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.RemoveSnapshot(snap.ID); err != nil {
		t.Fatal(err)
	}
	for _, k := range kids[:2] {
		if err := e.m.Remove(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if n := links(); n != 2 {
		t.Errorf("with 2 forks removed the ref has %d links, want 2", n)
	}
	if out := e.mustSh("k3", "cat /etc/tine-a"); out != "a\n" {
		t.Errorf("the last fork sees %q once its parent, its snapshot and its siblings are gone", out)
	}
	// A rollback to a snapshot of its own leaves it a stacked layer of
	// its own: the shared one goes.
	s3, err := e.m.Snapshot(ctx, "k3", sandbox.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Rollback(ctx, "k3", s3.ID); err != nil {
		t.Fatal(err)
	}
	if got := shared(); len(got) != 0 {
		t.Errorf("after the last fork rolled back, shared layers %v are left", got)
	}
	if out := e.mustSh("k3", "cat /etc/tine-a"); out != "a\n" {
		t.Errorf("the rolled-back fork sees %q", out)
	}
	// Removal of the last fork of a snapshot removes its layer too.
	if warm > 0 {
		e.waitWarm(1)
	}
	if _, err := e.m.Fork(ctx, "k3", sandbox.ForkOptions{N: 1, Names: []string{"k4"}}); err != nil {
		t.Fatal(err)
	}
	if got := shared(); len(got) != 1 {
		t.Fatalf("a fork of the rolled-back fork: shared layers %v, want one", got)
	}
	if err := e.m.Remove(ctx, "k4"); err != nil {
		t.Fatal(err)
	}
	if got := shared(); len(got) != 0 {
		t.Errorf("after its only fork was removed, shared layers %v are left", got)
	}
}

// TestSnapshotsCopyWhatChanged: snapshots of a sandbox with a few MB in
// its OS layer, taken one after another, each copying ahead of its
// freeze and linking what the one before holds (ADR 0207), each hold the
// layer as it was at their instant: forks of every one read their own
// files, whatever was rewritten, mapped, removed or added in between.
func TestSnapshotsCopyWhatChanged(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("a", sandbox.Limits{})
	e.mustSh("a", "mkdir -p /opt/big && for i in 1 2 3; do head -c 1100000 /dev/urandom > /opt/big/$i; done; echo v1 > /opt/big/small")
	sums := "cd /opt/big && sha256sum * | sort"
	var want []string
	var snaps []string
	for round, change := range []string{
		"",
		"head -c 1100000 /dev/urandom > /opt/big/2; echo v2 > /opt/big/small",
		"python3 -c \"import mmap; f=open('/opt/big/3','r+b'); m=mmap.mmap(f.fileno(), 0); m[0:4]=b'MMAP'; m.flush()\"",
		"rm /opt/big/1; head -c 1100000 /dev/urandom > /opt/big/4",
	} {
		if change != "" {
			e.mustSh("a", change)
		}
		// Past the racy window, so that the copy records what it reads.
		time.Sleep(100 * time.Millisecond)
		want = append(want, e.mustSh("a", sums))
		s, err := e.m.Snapshot(ctx, "a", sandbox.SnapshotOptions{})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		snaps = append(snaps, s.ID)
		if left, _ := filepath.Glob(filepath.Join(e.root, "snapshots", s.ID, ".tmp-*")); len(left) > 0 {
			t.Fatalf("round %d: left in the snapshot: %v", round, left)
		}
	}
	// /opt/big/1, unchanged in rounds 0-2, is one file in their copies.
	ino := func(id string) uint64 {
		t.Helper()
		st, err := os.Stat(filepath.Join(e.root, "snapshots", id, "runtime", "upper", "opt", "big", "1"))
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Ino
	}
	if ino(snaps[1]) != ino(snaps[0]) || ino(snaps[2]) != ino(snaps[0]) {
		t.Error("snapshots copied a file unchanged since the one before, not linked it")
	}
	for i, id := range snaps {
		name := fmt.Sprintf("from-%d", i)
		if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: name, Snapshot: id}); err != nil {
			t.Fatal(err)
		}
		if got := e.mustSh(name, sums); got != want[i] {
			t.Errorf("sandbox from snapshot %d reads\n%s\nwant\n%s", i, got, want[i])
		}
	}
}

// TestConcurrentForksNameApart: forks of one sandbox made at once with
// default names each get names of their own (p-1 .. p-6 among them),
// and a fork naming one fork twice is refused before anything is made.
func TestConcurrentForksNameApart(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("p", sandbox.Limits{})
	var wg sync.WaitGroup
	got := make([][]*sandbox.Info, 3)
	errs := make([]error, 3)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 2})
		}()
	}
	wg.Wait()
	var names []string
	for i := range got {
		if errs[i] != nil {
			t.Fatalf("fork %d of 3 at once: %v", i, errs[i])
		}
		for _, k := range got[i] {
			names = append(names, k.Name)
		}
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "p-1 p-2 p-3 p-4 p-5 p-6" {
		t.Fatalf("three forks into 2 at once made %v", names)
	}
	if _, err := e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 2, Names: []string{"q", "q"}}); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("a fork naming one fork twice: %v, want ErrExists", err)
	}
	if _, err := e.m.Get("q"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("the refused fork made q: %v", err)
	}
}
