package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"tine/audit"
	"tine/execpolicy"
	"tine/guestagent/proto"
	"tine/sandbox"
	"tine/sandbox/internal/cgroup"

	"golang.org/x/sys/unix"
)

// auditKinds returns the kinds of a sandbox's audit records, in order,
// after checking the log verifies.
func (e *env) auditKinds(name string) []string {
	e.t.Helper()
	recs := e.auditRecords(name)
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	return kinds
}

func (e *env) auditRecords(name string) []*audit.Record {
	e.t.Helper()
	p, err := e.m.AuditPath(name)
	if err != nil {
		e.t.Fatal(err)
	}
	rep, err := audit.VerifyFile(p)
	if err != nil {
		e.t.Fatal(err)
	}
	if !rep.OK() {
		e.t.Fatalf("audit log of %s: %v", name, rep.Problems)
	}
	f, err := os.Open(p)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	var recs []*audit.Record
	if err := audit.ReadAll(f, 0, func(r *audit.Record) error { recs = append(recs, r); return nil }); err != nil {
		e.t.Fatal(err)
	}
	return recs
}

// waitAudit waits until sandbox name's audit log has a record of kind.
func (e *env) waitAudit(name, kind string, d time.Duration) *audit.Record {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, r := range e.auditRecords(name) {
			if r.Kind == kind {
				return r
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no %q record in the audit log of %s within %v: %v", kind, name, d, e.auditKinds(name))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestMemoryLimitOOM: a sandbox over its memory limit has its hog killed
// by the kernel, alone; the kill is an audit record and a host event; the
// sandbox, another sandbox and the host run on; raising the limit of the
// running sandbox lets the same hog through.
func TestMemoryLimitOOM(t *testing.T) {
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 64}
	lim.MemoryBytes = 64 << 20
	e.create("hog", lim)
	e.create("other", sandbox.Limits{Pids: 64})
	e.putHelper(t, "hog")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := e.m.HostEvents(ctx, "hog")
	out, code := e.sh("hog", "tine-hostile hog 256")
	if code == 0 || strings.Contains(out, "held") {
		t.Fatalf("256 MiB under a 64 MiB limit: exit %d: %q", code, out)
	}
	r := e.waitAudit("hog", "oom-kill", 10*time.Second)
	t.Logf("hog killed (exit %d); audit: %s", code, r.Fields)
	select {
	case ev := <-events:
		if ev.Type != sandbox.EventOOMKill {
			t.Fatalf("host event %q, want %q", ev.Type, sandbox.EventOOMKill)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no oom-kill host event")
	}
	if out := e.mustSh("hog", "echo alive"); out != "alive\n" {
		t.Fatalf("the hog's sandbox after the kill: %q", out)
	}
	if out := e.mustSh("other", "echo alive"); out != "alive\n" {
		t.Fatalf("the other sandbox: %q", out)
	}
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	u, err := e.m.Usage("hog")
	if err != nil || u.OOMKills == 0 {
		t.Fatalf("usage %+v %v", u, err)
	}
	lim.MemoryBytes = 512 << 20
	if _, err := e.m.UpdateLimits(context.Background(), "hog", lim); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("hog", "tine-hostile hog 256"); out != "held 256 MiB\n" {
		t.Fatalf("256 MiB after raising the limit to 512 MiB: %q", out)
	}
	e.waitAudit("hog", "limits", time.Second)
}

// TestTmpfsBounds: each memory file system of a sandbox (/tmp, /run,
// /dev/shm) stops at its size and its inode count; the host runs on.
func TestTmpfsBounds(t *testing.T) {
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 64}
	lim.TmpfsBytes = 8 << 20
	e.create("fill", lim)
	e.create("dflt", sandbox.Limits{Pids: 64})
	for _, d := range []string{"/tmp", "/run", "/dev/shm"} {
		out, code := e.sh("fill", fmt.Sprintf("head -c 33554432 /dev/zero > %s/fill", d))
		if code == 0 || !strings.Contains(out, "No space left") {
			t.Fatalf("32 MiB into %s of 8 MiB: exit %d: %q", d, code, out)
		}
		kb, _ := strconv.Atoi(strings.Fields(e.mustSh("fill", fmt.Sprintf("du -k %s/fill", d)))[0])
		if kb > 8<<10 {
			t.Fatalf("%s: %d KiB written into 8 MiB", d, kb)
		}
		e.mustSh("fill", "rm "+d+"/fill")
		// Empty files: bounded by the inode count (2048 for 8 MiB).
		out, code = e.sh("fill", fmt.Sprintf("mkdir %s/many && cd %s/many && i=0; while [ $i -lt 3000 ]; do : > f$i || exit 1; i=$((i+1)); done", d, d))
		if code == 0 {
			t.Fatalf("3000 empty files in %s with 2048 inodes: %q", d, out)
		}
		e.mustSh("fill", "rm -rf "+d+"/many")
	}
	size := strings.Fields(e.mustSh("dflt", "df -k /tmp | tail -1"))[1]
	if size != strconv.Itoa(sandbox.DefaultTmpfsBytes>>10) {
		t.Fatalf("default /tmp: %s KiB, want %d", size, sandbox.DefaultTmpfsBytes>>10)
	}
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	t.Logf("/tmp, /run, /dev/shm: 32 MiB into 8 MiB refused (ENOSPC), 3000 files into 2048 inodes refused; default /tmp %s KiB", size)
}

// TestCPULimit: a busy loop under a 0.2 CPU limit uses at most about a
// fifth of the wall-clock time, read from the sandbox's cpuacct.
func TestCPULimit(t *testing.T) {
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 64}
	lim.CPUs = 0.2
	e.create("cpu", lim)
	u0, err := e.m.Usage("cpu")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.mustSh("cpu", "timeout 2 sh -c 'while :; do :; done' || true")
	wall := time.Since(start)
	u1, _ := e.m.Usage("cpu")
	used := time.Duration(u1.CPUNanos - u0.CPUNanos)
	t.Logf("0.2 CPU: used %v of CPU in %v", used, wall)
	if used > wall*30/100 {
		t.Fatalf("used %v of CPU in %v under a 0.2 CPU limit", used, wall)
	}
	if used < 50*time.Millisecond {
		t.Fatalf("used %v: the loop did not run", used)
	}
}

// TestFreezeThaw: a frozen sandbox uses no CPU and refuses commands; after
// thaw the same processes run and its port still listens.
func TestFreezeThaw(t *testing.T) {
	e := newEnv(t, 0)
	e.create("fz", sandbox.Limits{Pids: 64})
	ctx := context.Background()
	c, _ := e.m.Agent(ctx, "fz")
	spin, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"sh", "-c", "while :; do :; done"}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"busybox", "nc", "-l", "-p", "8080"}})
	if err != nil {
		t.Fatal(err)
	}
	waitPort := func() {
		for i := 0; ; i++ {
			ports, err := c.Ports(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ports {
				if p.Port == 8080 {
					return
				}
			}
			if i > 100 {
				t.Fatal("port 8080 not listening")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitPort()
	if err := e.m.Freeze(ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	u0, _ := e.m.Usage("fz")
	time.Sleep(time.Second)
	u1, _ := e.m.Usage("fz")
	if d := u1.CPUNanos - u0.CPUNanos; d != 0 {
		t.Fatalf("frozen sandbox used %d ns of CPU in 1 s", d)
	}
	if _, err := e.m.Exec(ctx, "fz", proto.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrFrozen) {
		t.Fatalf("exec in a frozen sandbox: %v", err)
	}
	if err := e.m.Thaw(ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	u2, _ := e.m.Usage("fz")
	if u2.CPUNanos-u1.CPUNanos < uint64(10*time.Millisecond) {
		t.Fatalf("thawed sandbox used %d ns in 300 ms: the loop does not run", u2.CPUNanos-u1.CPUNanos)
	}
	ps := e.mustSh("fz", "ps -o pid,args")
	for _, pid := range []int{spin.PID, srv.PID} {
		if !strings.Contains(ps, " "+strconv.Itoa(pid)+" ") && !strings.Contains(ps, "\n"+strconv.Itoa(pid)+" ") {
			t.Fatalf("pid %d gone after thaw: %s", pid, ps)
		}
	}
	waitPort()
	kinds := strings.Join(e.auditKinds("fz"), ",")
	if !strings.Contains(kinds, "freeze,thaw") {
		t.Fatalf("audit: %s", kinds)
	}
	t.Logf("frozen: 0 ns CPU in 1 s; thawed: %v in 300 ms; pids %d, %d and port 8080 intact", time.Duration(u2.CPUNanos-u1.CPUNanos), spin.PID, srv.PID)
}

// TestIdleAndLifetime: a sandbox idle for its Idle window is frozen and
// thawed by the next command, but never under a command that runs, even
// one started in its first second; one past its Lifetime is removed,
// also when the lifetime ran out while no manager was open.
func TestIdleAndLifetime(t *testing.T) {
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 64}
	lim.Idle = 2 * time.Second
	e.create("busy", lim)
	if out := e.mustSh("busy", "sleep 4; echo done"); out != "done\n" {
		t.Fatalf("a command longer than the idle window, started at once: %q", out)
	}
	e.create("idle", lim)
	deadline := time.Now().Add(15 * time.Second)
	for e.m.Frozen("idle") != "idle" {
		if time.Now().After(deadline) {
			t.Fatal("not frozen after 15 s idle with a 2 s idle limit")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out := e.mustSh("idle", "echo woke"); out != "woke\n" {
		t.Fatalf("after idle freeze: %q", out)
	}
	if e.m.Frozen("idle") != "" {
		t.Fatal("still frozen after a command")
	}

	lim = sandbox.Limits{Pids: 64}
	lim.Lifetime = 2 * time.Second
	e.create("short", lim)
	e.create("short2", lim)
	if err := e.m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	m, err := sandbox.Open(context.Background(), e.root, e.fs, sandbox.Options{Runtime: e.rt})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, err1 := m.Get("short")
		_, err2 := m.Get("short2")
		if errors.Is(err1, sandbox.ErrNotFound) && errors.Is(err2, sandbox.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxes past their lifetime still there after a restart: %v %v", err1, err2)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.waitAudit("short", "expire", time.Second)
}

// TestExecPolicyApprovals: allow runs, deny is refused, ask waits (the
// sandbox frozen) until a person approves or denies; all audited.
func TestExecPolicyApprovals(t *testing.T) {
	e := newEnv(t, 0)
	e.create("pol", sandbox.Limits{Pids: 64})
	p, err := execpolicy.ParseMap([]byte(`{"echo *": "allow", "rm -rf *": "deny", "*": "ask"}`))
	if err != nil {
		t.Fatal(err)
	}
	p.FreezeOnAsk = true
	if err := e.m.SetExecPolicy("pol", p); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("pol", "echo hi"); out != "hi\n" {
		t.Fatalf("echo: %q", out)
	}
	ctx := context.Background()
	run := func(argv ...string) (chan error, chan string) {
		errc, outc := make(chan error, 1), make(chan string, 1)
		go func() {
			p, err := e.m.Exec(ctx, "pol", proto.ExecRequest{Argv: argv})
			errc <- err
			if err == nil {
				b, _ := io.ReadAll(p.Stdout)
				p.Wait(ctx)
				outc <- string(b)
			}
		}()
		return errc, outc
	}
	errc, _ := run("rm", "-rf", "/")
	if err := <-errc; !errors.Is(err, sandbox.ErrDenied) {
		t.Fatalf("rm -rf /: %v", err)
	}
	waitAsk := func() *sandbox.Approval {
		for i := 0; i < 200; i++ {
			if as := e.m.Approvals(); len(as) == 1 {
				return as[0]
			}
			time.Sleep(25 * time.Millisecond)
		}
		t.Fatal("no approval pending")
		return nil
	}
	errc, outc := run("hostname")
	a := waitAsk()
	if a.Sandbox != "pol" || strings.Join(a.Argv, " ") != "hostname" || !a.Frozen {
		t.Fatalf("approval %+v", a)
	}
	if e.m.Frozen("pol") == "" {
		t.Fatal("the sandbox is not frozen while its command waits")
	}
	select {
	case err := <-errc:
		t.Fatalf("the asked command did not wait: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := e.m.Decide(a.ID, true, "test"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if out := <-outc; out != "pol\n" {
		t.Fatalf("approved command: %q", out)
	}
	if e.m.Frozen("pol") != "" {
		t.Fatal("still frozen after the approval")
	}
	errc, _ = run("ls")
	a = waitAsk()
	if _, err := e.m.Decide(a.ID, false, "test"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, sandbox.ErrDenied) {
		t.Fatalf("denied command: %v", err)
	}
	if _, err := e.m.Decide(a.ID, true, "test"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("second decision: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // the exec record comes once its output is read
	kinds := strings.Join(e.auditKinds("pol"), ",")
	for _, k := range []string{"exec-policy", "exec-denied", "approval-asked", "approval-granted", "approval-denied", "exec"} {
		if !strings.Contains(kinds, k) {
			t.Fatalf("no %s in the audit log: %s", k, kinds)
		}
	}
}

// TestAuditLifecycle: lifecycle operations and execs are recorded with
// their details, the log verifies, and an edit to it is caught.
func TestAuditLifecycle(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("au", sandbox.Limits{Pids: 64})
	e.sh("au", "echo hello; echo oops >&2; exit 3")
	if _, err := e.m.Snapshot(ctx, "au", sandbox.SnapshotOptions{Name: "s1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Fork(ctx, "au", sandbox.ForkOptions{N: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Stop(ctx, "au"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Start(ctx, "au"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Remove(ctx, "au"); err != nil {
		t.Fatal(err)
	}
	recs := e.auditRecords("au")
	var kinds []string
	var ex *audit.Record
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
		if r.Kind == "exec" {
			ex = r
		}
	}
	want := "create,exec,snapshot,snapshot,fork,stop,start,stop,remove"
	if strings.Join(kinds, ",") != want {
		t.Fatalf("records %v, want %s", kinds, want)
	}
	var f map[string]any
	json.Unmarshal(ex.Fields, &f)
	if f["exit_code"] != 3.0 || f["stdout_bytes"] != 6.0 || f["stderr_bytes"] != 5.0 || f["argv"] == nil || f["duration_ms"] == nil {
		t.Fatalf("exec record %s", ex.Fields)
	}
	if ks := e.auditKinds(""); !strings.Contains(strings.Join(ks, ","), "create,") {
		t.Fatalf("daemon log: %v", ks)
	}
	// A removed sandbox's log holds no descriptor of the daemon; a
	// sandbox made again with the name chains on in the same log.
	p, _ := e.m.AuditPath("au")
	if n := fdsTo(t, p); n != 0 {
		t.Errorf("%d descriptors still open on the removed sandbox's audit log", n)
	}
	e.create("au", sandbox.Limits{Pids: 64})
	if err := e.m.Remove(ctx, "au"); err != nil {
		t.Fatal(err)
	}
	if ks := strings.Join(e.auditKinds("au"), ","); ks != want+",create,stop,remove" {
		t.Fatalf("records after a second create and remove: %s", ks)
	}
	if rep, err := audit.VerifyFile(p); err != nil || !rep.OK() {
		t.Fatalf("the log of a name used twice does not verify: %+v %v", rep, err)
	}
	b, _ := os.ReadFile(p)
	os.WriteFile(p, []byte(strings.Replace(string(b), `"exit_code":3`, `"exit_code":0`, 1)), 0o600)
	if rep, _ := audit.VerifyFile(p); rep.OK() {
		t.Fatal("an edited exit code passes verification")
	}
	os.WriteFile(p, b[:len(b)/2], 0o600)
	if rep, _ := audit.VerifyFile(p); rep.OK() {
		t.Fatal("a truncated log passes verification")
	}
}

// fdsTo counts this process's open descriptors on path or below it
// (openFDs: features_test.go).
func fdsTo(t *testing.T, path string) int {
	n := 0
	for _, to := range openFDs(t) {
		if strings.HasPrefix(to, path) {
			n++
		}
	}
	return n
}

// TestLayerBound: a sandbox writing past its OS-layer bound is frozen
// within seconds, with an audit record; once thawed and cleaned it runs.
func TestLayerBound(t *testing.T) {
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 64}
	lim.LayerBytes = 16 << 20
	e.create("layer", lim)
	done := make(chan string, 1)
	go func() {
		out, _ := e.sh("layer", "head -c 67108864 /dev/zero > /var/tmp/fill && echo wrote")
		done <- out
	}()
	e.waitFrozen("layer", 20*time.Second, "writing 64 MiB into a 16 MiB OS layer")
	why := e.m.Frozen("layer")
	if u, err := e.m.Usage("layer"); err != nil || u.LayerBytes <= 16<<20 {
		t.Errorf("usage of the frozen sandbox: %+v %v, want its OS layer past 16 MiB", u, err)
	}
	e.waitAudit("layer", "layer-full", time.Second)
	if err := e.m.Thaw(context.Background(), "layer"); err != nil {
		t.Fatal(err)
	}
	<-done
	e.mustSh("layer", "rm /var/tmp/fill")
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	t.Logf("64 MiB into a 16 MiB OS layer: frozen (%s); thawed and cleaned, it runs", why)
}

// waitFrozen waits until sandbox name is frozen, failing after within
// (after what, the test's doing).
func (e *env) waitFrozen(name string, within time.Duration, after string) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for e.m.Frozen(name) == "" {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s not frozen %v after %s", name, within, after)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLayerBoundEmptyFiles: empty files and symlinks take no block of
// the host's disk but an inode each; a sandbox making thousands of them
// passes its OS layer's bound as a sandbox writing bytes does, so that no
// bound in bytes leaves the host's inodes to it.
func TestLayerBoundEmptyFiles(t *testing.T) {
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 64}
	lim.LayerBytes = 4 << 20
	e.create("inodes", lim)
	done := make(chan string, 1)
	go func() {
		out, _ := e.sh("inodes", "mkdir /var/tmp/many && cd /var/tmp/many && for i in $(seq 1500); do : > f$i; ln -s f$i l$i; done; echo made")
		done <- out
	}()
	e.waitFrozen("inodes", 30*time.Second, "making 3,000 empty files and symlinks in a 4 MiB OS layer")
	e.waitAudit("inodes", "layer-full", time.Second)
	u, err := e.m.Usage("inodes")
	if err != nil || u.LayerBytes <= 4<<20 {
		t.Fatalf("usage: %+v %v, want the OS layer past 4 MiB", u, err)
	}
	// A thaw would let the loop go on past the bound and freeze the
	// sandbox again (it did, when the freeze came before the loop's end):
	// the sandbox is removed, which ends the loop's command.
	if err := e.m.Remove(context.Background(), "inodes"); err != nil {
		t.Fatal(err)
	}
	<-done
	t.Logf("3,000 empty entries in a 4 MiB OS layer: frozen at %d bytes counted", u.LayerBytes)
}

// TestDevicePassthrough: a device given is usable inside at the same
// path and allowed by the sandbox's device cgroup, which allows nothing
// else beyond the base set; a host device not given is absent.
func TestDevicePassthrough(t *testing.T) {
	const dev = "/dev/cpu_dma_latency"
	if _, err := os.Stat(dev); err != nil {
		t.Skipf("this host has no %s to pass through: %v", dev, err)
	}
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 64}
	lim.Devices = []string{dev}
	e.create("dev", lim)
	// The other sandbox is given /dev/full (in its base set anyway), so
	// that it too runs without a user namespace, where a node the host
	// makes in its /dev could be opened but for the device cgroup.
	other := sandbox.Limits{Pids: 64}
	other.Devices = []string{"/dev/full"}
	e.create("nodev", other)
	if out := e.mustSh("dev", "od -An -tu4 -N4 "+dev); strings.TrimSpace(out) == "" {
		t.Fatalf("read %s: %q", dev, out)
	}
	if out, code := e.sh("nodev", "test -e "+dev); code == 0 {
		t.Fatalf("%s visible in a sandbox not given it: %q", dev, out)
	}
	if out, code := e.sh("dev", "ls /dev/vda /dev/kmsg"); code == 0 {
		t.Fatalf("host devices visible: %q", out)
	}
	if !cgroup.DevicesEnforced() {
		t.Log("this host's cgroups do not enforce device rules (v2 without a BPF program): the bind is the only gate")
		return
	}
	lists, _ := filepath.Glob("/sys/fs/cgroup/devices/tine/tine-*-dev/devices.list")
	if len(lists) != 1 {
		t.Fatalf("device cgroup of the sandbox: %v", lists)
	}
	b, _ := os.ReadFile(lists[0])
	var st unix.Stat_t
	unix.Stat(dev, &st)
	want := fmt.Sprintf("c %d:%d rwm", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if !strings.Contains(string(b), want) || strings.Contains(string(b), "a *:*") || strings.Contains(string(b), "b 254") {
		t.Fatalf("devices.list lacks %q or allows more:\n%s", want, b)
	}
	// The same node, made by the host in the other sandbox's /dev, is
	// refused there by its device cgroup, though the file is there.
	if out, code := e.sh("nodev", "head -c 1 /dev/full >/dev/null && echo ok"); code != 0 || out != "ok\n" {
		t.Fatalf("base device /dev/full: %q", out)
	}
	procs, _ := filepath.Glob("/sys/fs/cgroup/pids/tine/tine-*-nodev/cgroup.procs")
	if len(procs) != 1 {
		t.Fatalf("pids cgroup of the other sandbox: %v", procs)
	}
	pb, _ := os.ReadFile(procs[0])
	pid := strings.Fields(string(pb))[0]
	node := "/proc/" + pid + "/root" + dev
	if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(st.Rdev)); err != nil {
		t.Fatalf("mknod %s from the host: %v", node, err)
	}
	if out, code := e.sh("nodev", "ls -l "+dev+" && od -An -tu4 -N4 "+dev); code == 0 || !strings.Contains(out, "not permitted") {
		t.Fatalf("a device outside the sandbox's rules opened: exit %d: %q", code, out)
	}
	t.Logf("%s passed through (%s); devices.list:\n%s", dev, want, b)
}

// TestGPUPassthrough runs where the NVIDIA driver is loaded: nvidia-smi
// inside lists the GPUs, and the driver's libraries are read-only.
func TestGPUPassthrough(t *testing.T) {
	if m, _ := filepath.Glob("/dev/nvidia*"); len(m) == 0 {
		t.Skip("no /dev/nvidia* on this host (no NVIDIA GPU or driver): --gpu cannot be tested here")
	}
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 256}
	lim.GPU = true
	e.create("gpu", lim)
	out := e.mustSh("gpu", "ls /dev/nvidia*; nvidia-smi -L")
	if !strings.Contains(out, "GPU 0") {
		t.Fatalf("nvidia-smi -L in the sandbox: %q", out)
	}
	lib := strings.TrimSpace(e.mustSh("gpu", "ldconfig -p | grep -m1 'libcuda.so' | sed 's/.*=> //'"))
	if lib != "" {
		if o, code := e.sh("gpu", "touch $(readlink -f "+lib+")"); code == 0 || !strings.Contains(o, "Read-only") {
			t.Fatalf("driver library %s writable in the sandbox: %q", lib, o)
		}
	}
	t.Logf("nvidia-smi in the sandbox:\n%s", out)
}

// TestIOLimit: direct writes under a 1 MiB/s write limit take about a
// second per MiB; the limit removed, the same writes are quick.
func TestIOLimit(t *testing.T) {
	e := newEnv(t, 0)
	lim := sandbox.Limits{Pids: 64}
	lim.IOWriteBPS = 1 << 20
	e.create("io", lim)
	write := func() time.Duration {
		start := time.Now()
		out, code := e.sh("io", "dd if=/dev/zero of=/var/tmp/io bs=256k count=12 oflag=direct 2>&1; rm -f /var/tmp/io")
		if code != 0 {
			t.Skipf("direct writes are not possible in the sandbox's layer here: %s", out)
		}
		return time.Since(start)
	}
	slow := write()
	lim.IOWriteBPS = 0
	if _, err := e.m.UpdateLimits(context.Background(), "io", lim); err != nil {
		t.Fatal(err)
	}
	fast := write()
	t.Logf("3 MiB of direct writes: %v at 1 MiB/s, %v without a limit", slow, fast)
	if slow < 2*time.Second {
		t.Fatalf("3 MiB at 1 MiB/s took %v", slow)
	}
	if fast > slow/2 {
		t.Fatalf("without the limit: %v, with it: %v: the update did not remove it", fast, slow)
	}
}

// TestWarmLimits: a sandbox bound to a warm instance gets its limits and
// the device allow-list at bind, as a cold one does at start.
func TestWarmLimits(t *testing.T) {
	if !cgroup.CanRename() {
		t.Skip("no warm sandboxes on this host (cgroup v2 groups cannot be renamed)")
	}
	e := newEnvWith(t, sandbox.Options{Warm: 1})
	lim := sandbox.Limits{Pids: 64}
	lim.MemoryBytes = 96 << 20
	lim.CPUs = 0.5
	e.create("w", lim)
	if e.rt.WarmBound() != 1 {
		t.Fatalf("the sandbox was not bound to a warm instance (%d bound)", e.rt.WarmBound())
	}
	read := func(glob string) string {
		m, _ := filepath.Glob(glob)
		if len(m) != 1 {
			t.Fatalf("%s: %v", glob, m)
		}
		b, _ := os.ReadFile(m[0])
		return strings.TrimSpace(string(b))
	}
	if v := read("/sys/fs/cgroup/memory/tine/tine-*-w/memory.limit_in_bytes"); v != "100663296" {
		t.Fatalf("memory limit of the warm-bound sandbox: %s", v)
	}
	if v := read("/sys/fs/cgroup/cpu/tine/tine-*-w/cpu.cfs_quota_us"); v != "50000" {
		t.Fatalf("cpu quota of the warm-bound sandbox: %s", v)
	}
	if cgroup.DevicesEnforced() && strings.Contains(read("/sys/fs/cgroup/devices/tine/tine-*-w/devices.list"), "a *:*") {
		t.Fatal("the warm-bound sandbox may use every device")
	}
	if out := e.mustSh("w", "df -k /tmp | tail -1"); strings.Fields(out)[1] != strconv.Itoa(sandbox.DefaultTmpfsBytes>>10) {
		t.Fatalf("/tmp of the warm-bound sandbox: %q", out)
	}
}
