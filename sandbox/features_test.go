package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tine/cowfs"
	"tine/sandbox"
)

// readLogs reads the sandbox's service log without following it.
func (e *env) readLogs(name string, tail int) string {
	e.t.Helper()
	r, err := e.m.Logs(context.Background(), name, sandbox.LogOptions{Tail: tail})
	if err != nil {
		e.t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

// waitLog waits until the sandbox's log holds want.
func (e *env) waitLog(name, want string) string {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := e.readLogs(name, 0)
		if strings.Contains(got, want) {
			return got
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: log lacks %q:\n%s", name, want, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServicesAndLogs: services start at create, again at rollback,
// fork and restart; their output lands in the log, which Tail and Follow
// read.
func TestServicesAndLogs(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	svc := []string{
		"echo started $(cat /etc/tine-svc-mark 2>/dev/null || echo fresh) in $(pwd); echo to-stderr >&2; sleep 1000",
		"while :; do if [ -e /tmp/ping ]; then echo pong; rm /tmp/ping; fi; sleep 0.05; done",
	}
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "s", Dir: e.project, Services: svc}); err != nil {
		t.Fatal(err)
	}
	log := e.waitLog("s", "started fresh in "+e.project)
	e.waitLog("s", "to-stderr")
	if !strings.Contains(log, "[tine] service 1 started") {
		t.Fatalf("no start line:\n%s", log)
	}
	if out := e.mustSh("s", "ps -e -o args= | grep -c '^sleep 1000$'"); strings.TrimSpace(out) != "1" {
		t.Fatalf("service processes: %q", out)
	}
	// Follow sees a line written after it started reading.
	fctx, cancel := context.WithCancel(ctx)
	r, err := e.m.Logs(fctx, "s", sandbox.LogOptions{Follow: true, Tail: 1})
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	e.mustSh("s", "touch /tmp/ping")
	for got := false; !got; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("follow ended early")
			}
			got = l == "pong"
		case <-time.After(20 * time.Second):
			t.Fatal("follow did not see pong")
		}
	}
	cancel()
	r.Close()
	if got := e.readLogs("s", 2); strings.Count(got, "\n") != 2 {
		t.Fatalf("tail 2: %q", got)
	}

	// Snapshot carries the services; the fork starts them again with the
	// files of the snapshot.
	e.mustSh("s", "echo marked > /etc/tine-svc-mark")
	snap, err := e.m.Snapshot(ctx, "s", sandbox.SnapshotOptions{Name: "marked"})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Services) != 2 {
		t.Fatalf("snapshot services: %q", snap.Services)
	}
	kids, err := e.m.Fork(ctx, "s", sandbox.ForkOptions{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(kids[0].Services) != 2 {
		t.Fatalf("fork services: %q", kids[0].Services)
	}
	e.waitLog(kids[0].Name, "started marked")

	// Rollback restarts them.
	e.mustSh("s", "rm /etc/tine-svc-mark")
	if err := e.m.Rollback(ctx, "s", "marked"); err != nil {
		t.Fatal(err)
	}
	e.waitLog("s", "started marked")
	if out := e.mustSh("s", "ps -e -o args= | grep -c '^sleep 1000$'"); strings.TrimSpace(out) != "1" {
		t.Fatalf("after rollback, service processes: %q", out)
	}

	// A removed sandbox's service log holds no descriptor (which would
	// keep the deleted file's space).
	logDir := filepath.Join(e.root, "sandboxes", "s", "logs")
	if n := fdsTo(t, logDir); n == 0 {
		t.Fatalf("no descriptor on %s while the services run: the check below would prove nothing", logDir)
	}
	if err := e.m.Remove(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if n := fdsTo(t, logDir); n != 0 {
		t.Errorf("%d descriptors still open on the removed sandbox's service log", n)
	}
}

// TestLogCapped: a service that prints without end leaves at most
// LogCap bytes on the host.
func TestLogCapped(t *testing.T) {
	printed := 5 * sandbox.LogCap
	e := newEnv(t, 0)
	ctx := context.Background()
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "loud", Dir: e.project,
		Services: []string{fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo; echo done-printing", printed)}}); err != nil {
		t.Fatal(err)
	}
	e.waitLog("loud", "service 1 exited with code 0")
	var total int64
	files, _ := filepath.Glob(filepath.Join(e.root, "sandboxes", "loud", "logs", "*"))
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		total += st.Size()
	}
	if total > sandbox.LogCap {
		t.Fatalf("log files hold %d bytes, cap %d", total, sandbox.LogCap)
	}
	if !strings.Contains(e.readLogs("loud", 3), "done-printing") {
		t.Fatal("the end of the output was not kept")
	}
	t.Logf("%d bytes printed, %d bytes kept in %d files", printed, total, len(files))
}

// TestSnapshotLabels: labels are unique per sandbox and validated;
// Snapshots lists oldest first; Rollback and Diff take a label or an id.
func TestSnapshotLabels(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("l", sandbox.Limits{})
	e.mustSh("l", fmt.Sprintf("echo a > %s/f", e.project))
	a, err := e.m.Snapshot(ctx, "l", sandbox.SnapshotOptions{Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Snapshot(ctx, "l", sandbox.SnapshotOptions{Name: "first"}); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("second label 'first': %v", err)
	}
	// At once, one label: one snapshot takes it, the others are refused.
	made := make(chan error, 4)
	for range 4 {
		go func() { _, err := e.m.Snapshot(ctx, "l", sandbox.SnapshotOptions{Name: "race"}); made <- err }()
	}
	took := 0
	for range 4 {
		if err := <-made; err == nil {
			took++
		} else if !errors.Is(err, sandbox.ErrExists) {
			t.Fatal(err)
		}
	}
	if took != 1 {
		t.Fatalf("%d snapshots took label race at once", took)
	}
	for _, bad := range []string{"snap-1", "../x", "a b", strings.Repeat("x", 64)} {
		if _, err := e.m.Snapshot(ctx, "l", sandbox.SnapshotOptions{Name: bad}); err == nil {
			t.Fatalf("label %q accepted", bad)
		}
	}
	e.mustSh("l", fmt.Sprintf("echo b > %s/f; echo new > %s/g", e.project, e.project))
	b, err := e.m.Snapshot(ctx, "l", sandbox.SnapshotOptions{Name: "second"})
	if err != nil {
		t.Fatal(err)
	}
	list, err := e.m.Snapshots("l")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0].ID != a.ID || list[2].ID != b.ID || list[0].Name != "first" || list[1].Name != "race" {
		t.Fatalf("snapshots: %+v", list)
	}
	changes, err := e.m.Diff(ctx, "l", "first")
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 2 {
		t.Fatalf("diff since first: %+v", changes)
	}
	if changes, err = e.m.Diff(ctx, "l", b.ID); err != nil || len(changes) != 0 {
		t.Fatalf("diff since second by id: %+v %v", changes, err)
	}
	if _, err := e.m.Diff(ctx, "l", "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("diff since an unknown label: %v", err)
	}
	if err := e.m.Rollback(ctx, "l", "first"); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("l", fmt.Sprintf("cat %s/f; ls %s", e.project, e.project)); out != "a\nf\nsrc\n" {
		t.Fatalf("after rollback to first: %q", out)
	}
	// Another sandbox may reuse the label; it cannot use l's snapshots.
	e.create("m", sandbox.Limits{})
	if _, err := e.m.Snapshot(ctx, "m", sandbox.SnapshotOptions{Name: "first"}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Rollback(ctx, "m", a.ID); err == nil {
		t.Fatal("rollback of m to a snapshot of l succeeded")
	}
}

// TestStatusAndStaleness: Status counts processes and listening ports,
// bytes written, and the host files changed, added and removed since the
// import, without a re-import.
func TestStatusAndStaleness(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	os.WriteFile(filepath.Join(e.project, "keep.txt"), []byte("same\n"), 0o644)
	os.WriteFile(filepath.Join(e.project, "gone.txt"), []byte("x\n"), 0o644)
	os.MkdirAll(filepath.Join(e.project, "gonedir", "deep"), 0o755)
	e.create("st", sandbox.Limits{})
	st, err := e.m.Status(ctx, "st")
	if err != nil {
		t.Fatal(err)
	}
	if st.Stale.Changed+st.Stale.Added+st.Stale.Removed != 0 || st.Stale.Unknown != "" || st.Processes < 1 {
		t.Fatalf("fresh status: %+v", st)
	}
	e.mustSh("st", fmt.Sprintf("head -c 100000 /dev/zero > %s/big; (python3 -m http.server 18080 --bind 127.0.0.1 >/dev/null 2>&1 || busybox nc -l -p 18080) & sleep 0.5", e.project))
	// The host moves on: one file changed, one added, one removed, a
	// directory removed.
	time.Sleep(10 * time.Millisecond)
	os.WriteFile(filepath.Join(e.project, "src", "main.txt"), []byte("v2\n"), 0o644)
	os.WriteFile(filepath.Join(e.project, "added.txt"), nil, 0o644)
	os.Remove(filepath.Join(e.project, "gone.txt"))
	os.RemoveAll(filepath.Join(e.project, "gonedir"))
	// The server may take a while to listen on a loaded host: wait for it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err = e.m.Status(ctx, "st")
		if err != nil {
			t.Fatal(err)
		}
		if st.Ports == 1 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("status: processes %d ports %d bytes %d stale %+v", st.Processes, st.Ports, st.ProjectBytes, st.Stale)
	if st.Stale.Changed != 1 || st.Stale.Added != 1 || st.Stale.Removed != 2 || st.Stale.Partial {
		t.Fatalf("staleness: %+v", st.Stale)
	}
	if st.ProjectBytes < 100000 {
		t.Fatalf("project bytes %d, wrote 100000", st.ProjectBytes)
	}
	if st.Ports != 1 || st.Processes < 2 {
		t.Fatalf("processes %d, ports %d: want the server's", st.Processes, st.Ports)
	}
	// A sandbox made from a snapshot of a snapshot still knows its host
	// directory (forks carry it).
	kids, err := e.m.Fork(ctx, "st", sandbox.ForkOptions{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	kst, err := e.m.Status(ctx, kids[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	if kst.Stale.Changed != st.Stale.Changed || kst.Stale.Added != st.Stale.Added || kst.Stale.Removed != st.Stale.Removed {
		t.Fatalf("fork staleness %+v, parent %+v", kst.Stale, st.Stale)
	}
	if err := e.m.Stop(ctx, "st"); err != nil {
		t.Fatal(err)
	}
	if st, err = e.m.Status(ctx, "st"); err != nil || st.Processes != 0 || st.State != sandbox.Stopped {
		t.Fatalf("stopped status: %+v %v", st, err)
	}
}

// TestPromote: the sandbox's project changes reach the host directory;
// a second promotion carries only the newer changes; a conflicting host
// change stops it; a sandbox from a snapshot without a host base is
// refused.
func TestPromote(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("pr", sandbox.Limits{})
	e.mustSh("pr", fmt.Sprintf("echo v2 > %s/src/main.txt; echo new > %s/new.txt", e.project, e.project))
	res, err := e.m.Promote(ctx, "pr", sandbox.PromoteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Applied || len(res.Changes) != 2 {
		t.Fatalf("promote: %+v", res)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "src", "main.txt")); string(b) != "v2\n" {
		t.Fatalf("host main.txt: %q", b)
	}
	e.mustSh("pr", fmt.Sprintf("echo v3 > %s/new.txt", e.project))
	if res, err = e.m.Promote(ctx, "pr", sandbox.PromoteOptions{}); err != nil || len(res.Changes) != 1 {
		t.Fatalf("second promote: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "new.txt")); string(b) != "v3\n" {
		t.Fatalf("host new.txt: %q", b)
	}
	// The host edits the file the sandbox edits too: a conflict, nothing written.
	os.WriteFile(filepath.Join(e.project, "new.txt"), []byte("host\n"), 0o644)
	e.mustSh("pr", fmt.Sprintf("echo v4 > %s/new.txt", e.project))
	if _, err := e.m.Promote(ctx, "pr", sandbox.PromoteOptions{}); !errors.Is(err, cowfs.ErrConflict) {
		t.Fatalf("conflicting promote: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "new.txt")); string(b) != "host\n" {
		t.Fatalf("host new.txt after a conflict: %q", b)
	}
	// A snapshot whose host base is unknown (metadata of an older tine):
	// its sandboxes refuse promotion with the reason.
	s, err := e.m.Snapshot(ctx, "pr", sandbox.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(e.root, "snapshots", s.ID, "snapshot.json")
	b, _ := os.ReadFile(p)
	b = []byte(strings.Replace(string(b), `"host_base"`, `"ignored"`, 1))
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "orphan", Snapshot: s.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Promote(ctx, "orphan", sandbox.PromoteOptions{}); err == nil || !strings.Contains(err.Error(), "does not record the host directory") {
		t.Fatalf("promote of a sandbox without a host base: %v", err)
	}
}

// TestRestartRecovery: a sandbox survives its manager's exit: a new
// manager on the same root starts it with its project and OS-layer files
// and its services; half-made sandboxes and snapshots left by a crash are
// cleaned up at Open.
func TestRestartRecovery(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "rr", Dir: e.project,
		Services: []string{"echo service-run; sleep 1000"}}); err != nil {
		t.Fatal(err)
	}
	e.waitLog("rr", "service-run")
	e.mustSh("rr", fmt.Sprintf("echo kept > %s/kept.txt; echo kept > /etc/tine-restart-kept", e.project))
	if err := e.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// What a crash mid-create and mid-snapshot leaves.
	half := filepath.Join(e.root, "sandboxes", "half")
	os.MkdirAll(filepath.Join(half, "runtime", "upper"), 0o700)
	if id, err := e.fs.Import(ctx, e.project, ""); err != nil {
		t.Fatal(err)
	} else if err := e.fs.Branch(ctx, id, "sandbox.half"); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(e.root, "snapshots", "snap-halfmade", "runtime"), 0o700)
	os.WriteFile(filepath.Join(e.root, "sandboxes", "rr", ".tmp-123"), []byte("{"), 0o600)

	m2, err := e.reopen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered: %q", m2.Recovered())
	if len(m2.Recovered()) != 2 {
		t.Fatalf("recovered: %q", m2.Recovered())
	}
	for _, p := range []string{half, filepath.Join(e.root, "snapshots", "snap-halfmade"), filepath.Join(e.root, "sandboxes", "rr", ".tmp-123")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left after Open", p)
		}
	}
	if _, err := e.fs.Head(ctx, "sandbox.half"); !errors.Is(err, cowfs.ErrNoBranch) {
		t.Errorf("branch of the half-made sandbox: %v", err)
	}
	info, err := m2.Get("rr")
	if err != nil || info.State != sandbox.Stopped {
		t.Fatalf("after reopen: %+v %v", info, err)
	}
	if err := m2.Start(ctx, "rr"); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("rr", fmt.Sprintf("cat %s/kept.txt /etc/tine-restart-kept", e.project)); out != "kept\nkept\n" {
		t.Fatalf("after restart: %q", out)
	}
	log := e.waitLog("rr", "service 1 started")
	if strings.Count(log, "service-run") < 2 {
		// Wait for the second run's line.
		deadline := time.Now().Add(20 * time.Second)
		for strings.Count(e.readLogs("rr", 0), "service-run") < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("the service did not run again:\n%s", e.readLogs("rr", 0))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestRemoveLeavesNoDescriptors: a sandbox's whole life (a service, a
// command, a snapshot, a fork, its logs and audit records) leaves no
// descriptor open in the daemon once the sandbox and its fork are
// removed. A first round opens what the daemon keeps for good.
func TestRemoveLeavesNoDescriptors(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	life := func(i int) {
		name := fmt.Sprintf("fd%d", i)
		if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: name, Dir: e.project, Services: []string{"echo up; sleep 1000"}}); err != nil {
			t.Fatal(err)
		}
		e.waitLog(name, "up")
		e.mustSh(name, "echo hi > /tmp/x")
		if _, err := e.m.Snapshot(ctx, name, sandbox.SnapshotOptions{}); err != nil {
			t.Fatal(err)
		}
		kids, err := e.m.Fork(ctx, name, sandbox.ForkOptions{N: 1})
		if err != nil {
			t.Fatal(err)
		}
		e.readLogs(kids[0].Name, 0)
		for _, n := range []string{kids[0].Name, name} {
			if err := e.m.Remove(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	life(0)
	before := openFDs(t)
	for i := 1; i <= 3; i++ {
		life(i)
	}
	// Descriptors closed by goroutines that end after Remove returns.
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := openFDs(t)
		if len(after) <= len(before) {
			break
		}
		if time.Now().After(deadline) {
			var extra []string
			for fd, to := range after {
				if before[fd] != to {
					extra = append(extra, fd+" -> "+to)
				}
			}
			t.Fatalf("%d descriptors before three sandbox lives, %d after; new: %v", len(before), len(after), extra)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openFDs returns this process's open descriptors and what they name.
func openFDs(t *testing.T) map[string]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		to, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		out[e.Name()] = to
	}
	return out
}
