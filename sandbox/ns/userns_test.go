package ns

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/guestagent/client"
	"tine/sandbox"
)

// TestUserns runs a sandbox in a user namespace: its root is host uid
// idBase, sees the host's files and the project owned as on the host,
// and what it writes is owned on disk as it would be without the mapping.
func TestUserns(t *testing.T) {
	rt := usernsRuntime(t)
	dir := t.TempDir()
	proj := filepath.Join(dir, "proj")
	os.Mkdir(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "a"), []byte("A"), 0o644)
	ctx := context.Background()
	in, err := rt.Start(ctx, sandbox.Spec{ID: "nsuserns", Hostname: "nsuserns", Dir: filepath.Join(dir, "rt"),
		ProjectPath: "/work/proj-nsuserns", ProjectSource: proj})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop(ctx)
	c := dialWait(t, in)
	defer c.Close()
	base, _ := idRange()
	out, code := run(t, c, "sh", "-c", `set -e; cat /proc/self/uid_map; id -u; stat -c %u:%g /etc/passwd /work/proj-nsuserns/a
echo B >> /work/proj-nsuserns/a; echo n > /work/proj-nsuserns/new
echo x > /etc/nsuserns-x; echo y > /etc/nsuserns-y; chown 1000:1000 /etc/nsuserns-y`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	if got, want := strings.Join(strings.Fields(out), " "), fmt.Sprintf("0 %d %d 0 0:0 0:0", base, idSize); got != want {
		t.Errorf("sandbox said %q, want %q", got, want)
	}
	owner := func(p string) string {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
	}
	for p, want := range map[string]string{
		filepath.Join(proj, "new"):                           "0:0",
		filepath.Join(dir, "rt", upperDir, "etc/nsuserns-x"): "0:0",
		filepath.Join(dir, "rt", upperDir, "etc/nsuserns-y"): "1000:1000",
	} {
		if got := owner(p); got != want {
			t.Errorf("%s owned by %s on the host, want %s", p, got, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(proj, "a")); string(b) != "AB\n" {
		t.Errorf("project file: %q", b)
	}
	// The agent is host uid base.
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", in.(*instance).pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), fmt.Sprintf("Uid:\t%d\t%d", base, base)) {
		t.Errorf("pid 1 of the sandbox is not host uid %d:\n%s", base, st)
	}
}

// usernsRuntime returns a runtime whose sandboxes run in user
// namespaces, which this host allows.
func usernsRuntime(t *testing.T) *Runtime {
	t.Helper()
	rt, err := New(buildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := rt.Userns(); !ok {
		t.Fatalf("this host allows user namespaces, but: %s", why)
	}
	return rt
}

// statusField returns field (e.g. "PPid") of /proc/PID/status.
func statusField(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// TestSpawner: a sandbox in a user namespace is started by the spawner,
// not forked from this process (ADR 0193); killing the spawner ends the
// sandboxes it started, and the next start runs a new spawner.
func TestSpawner(t *testing.T) {
	rt := usernsRuntime(t)
	dir := t.TempDir()
	ctx := context.Background()
	start := func(id string) *instance {
		t.Helper()
		in, err := rt.Start(ctx, sandbox.Spec{ID: id, Hostname: id, Dir: filepath.Join(dir, id),
			ProjectPath: "/work/proj-" + id, ProjectSource: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { in.Stop(ctx) })
		dialWait(t, in).Close()
		return in.(*instance)
	}
	in := start("nsspawn1")
	ppid := statusField(t, in.pid, "PPid")
	if ppid == fmt.Sprint(os.Getpid()) {
		t.Fatalf("the sandbox's pid 1 is a child of this process, not of the spawner")
	}
	if err := unix.Kill(mustAtoi(t, ppid), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-in.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the sandbox outlived its spawner by 10 s")
	}
	in2 := start("nsspawn2")
	if p := statusField(t, in2.pid, "PPid"); p == ppid || p == fmt.Sprint(os.Getpid()) {
		t.Fatalf("the next sandbox's parent is %s: want a new spawner (the old was %s, this process is %d)", p, ppid, os.Getpid())
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}

func dialWait(t *testing.T, in sandbox.Instance) *client.Client {
	ctx := context.Background()
	for i := 0; ; i++ {
		c, err := client.Dial(ctx, in.AgentSocket())
		if err == nil {
			return c
		}
		if i > 2000 {
			t.Fatal(err, in.(*instance).log.String())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNoUserns runs a sandbox with user namespaces turned off: its root
// is the host's (the identity mapping).
func TestNoUserns(t *testing.T) {
	rt, err := New(buildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	rt.UseUserns(false)
	if ok, why := rt.Userns(); ok || why != "turned off" {
		t.Fatalf("Userns() = %v, %q", ok, why)
	}
	dir := t.TempDir()
	proj := filepath.Join(dir, "proj")
	os.Mkdir(proj, 0o755)
	ctx := context.Background()
	in, err := rt.Start(ctx, sandbox.Spec{ID: "nsnouserns", Hostname: "h", Dir: filepath.Join(dir, "rt"),
		ProjectPath: "/work/proj-nsnouserns", ProjectSource: proj})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop(ctx)
	c := dialWait(t, in)
	defer c.Close()
	out, code := run(t, c, "sh", "-c", "cat /proc/self/uid_map; echo x > /work/proj-nsnouserns/f")
	if got := strings.Join(strings.Fields(out), " "); code != 0 || got != "0 0 4294967295" {
		t.Fatalf("exit %d: %q", code, got)
	}
}
