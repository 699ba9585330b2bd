package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// attempts collects what a hostile test tried and how it ended, for the
// test log.
type attempts struct {
	t     *testing.T
	lines []string
}

func (a *attempts) add(what, result string) {
	a.lines = append(a.lines, fmt.Sprintf("%-58s %s", what, result))
}

func (a *attempts) log() {
	a.t.Logf("attempts from inside the sandbox:\n%s", strings.Join(a.lines, "\n"))
}

var (
	hostileOnce sync.Once
	hostileBin  string
	hostileErr  error
)

// hostileHelper builds the static helper program that makes the system
// calls a sandbox must not make.
func hostileHelper(t *testing.T) string {
	t.Helper()
	hostileOnce.Do(func() {
		hostileBin = filepath.Join(filepath.Dir(agentPath), "tine-hostile")
		cmd := exec.Command("go", "build", "-o", hostileBin, "tine/sandbox/internal/hostile")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			hostileErr = fmt.Errorf("build the hostile helper: %v\n%s", err, out)
		}
	})
	if hostileErr != nil {
		t.Fatal(hostileErr)
	}
	return hostileBin
}

// putHelper copies the helper into sandbox name at /usr/local/bin/tine-hostile.
func (e *env) putHelper(t *testing.T, name string) {
	t.Helper()
	f, err := os.Open(hostileHelper(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := e.m.Agent(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PutFile(context.Background(), "/usr/local/bin/tine-hostile", 0o755, f); err != nil {
		t.Fatal(err)
	}
}

// runAs runs argv in sandbox name as uid:gid and returns its output.
func (e *env) runAs(name string, uid uint32, argv ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gid := uid
	p, err := e.m.Exec(ctx, name, proto.ExecRequest{Argv: argv, UID: &uid, GID: &gid})
	if err != nil {
		e.t.Fatal(err)
	}
	var errb bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&errb, p.Stderr); close(done) }()
	out, _ := io.ReadAll(p.Stdout)
	<-done
	p.Wait(ctx)
	return string(out) + errb.String()
}

// TestHostile: what a sandbox's root must not be able to do, in a sandbox
// started cold and in one bound to a warm instance. Each case is a shell
// script that prints "ESCAPED" only if the attempt succeeded.
func TestHostile(t *testing.T) {
	t.Run("cold", func(t *testing.T) { testHostile(t, newEnv(t, 0), false) })
	t.Run("warm", func(t *testing.T) {
		e := newEnvWith(t, sandbox.Options{Warm: 1})
		testHostile(t, e, false)
		if e.rt.WarmBound() != 1 {
			t.Fatal("the sandbox did not take the warm instance")
		}
	})
	// A warm fork of a sandbox that filled its OS layer with symlinks to
	// host paths: the fork's root is built over that layer.
	t.Run("warm fork", func(t *testing.T) {
		e := newEnvWith(t, sandbox.Options{Warm: 2})
		testHostile(t, e, true)
		if e.rt.WarmBound() != 2 {
			t.Fatalf("%d warm instances bound, want 2 (parent and fork)", e.rt.WarmBound())
		}
	})
}

func testHostile(t *testing.T, e *env, fork bool) {
	if fork {
		e.create("hp", sandbox.Limits{Pids: 64})
		e.mustSh("hp", "ln -s / /etc/host-root; ln -s /proc/1/root /root/pid1root; mkdir -p /run/x; ln -sf / /tmp/up; "+
			"rm -rf /mnt; ln -s / /mnt; ln -s /run/tine /var/agent-dir; true")
		e.waitWarm(1)
		if _, err := e.m.Fork(context.Background(), "hp", sandbox.ForkOptions{N: 1, Names: []string{"h"}}); err != nil {
			t.Fatal(err)
		}
	} else {
		e.create("h", sandbox.Limits{Pids: 64})
	}
	a := &attempts{t: t}
	defer a.log()
	marker := fmt.Sprintf("/tmp/tine-hostile-%d", os.Getpid())
	os.Remove(marker)
	t.Cleanup(func() { os.Remove(marker) })
	host := os.Getpid()
	hostName, _ := os.Hostname()
	cases := []struct{ name, script string }{
		{"write through a symlink in the project", fmt.Sprintf("ln -s %s %s/ln && echo x > %s/ln; true", marker, e.project, e.project)},
		{"write through a directory symlink in the project", fmt.Sprintf("ln -s /tmp %s/tmpln && echo x > %s/tmpln/%s; true", e.project, e.project, filepath.Base(marker))},
		{"write via .. out of the project", fmt.Sprintf("echo x > %s/../../../../..%s; true", e.project, marker)},
		{"write via /proc/self/root", fmt.Sprintf("echo x > /proc/self/root%s; true", marker)},
		{"write via /proc/1/root", fmt.Sprintf("echo x > /proc/1/root%s; true", marker)},
		{"signal a host pid (kill -0)", fmt.Sprintf("kill -0 %d 2>/dev/null && echo ESCAPED; true", host)},
		{"see the host pid in /proc", fmt.Sprintf("test -e /proc/%d && echo ESCAPED; true", host)},
		{"see host processes", "test $(ls -d /proc/[0-9]* | wc -l) -lt 10 || echo ESCAPED"},
		{"mount (shell)", "mount -t tmpfs none /mnt 2>/dev/null && echo ESCAPED; true"},
		{"unshare a user namespace (shell)", "unshare -U true 2>/dev/null && echo ESCAPED; unshare -r true 2>/dev/null && echo ESCAPED; true"},
		{"strace pid 1", "strace -p 1 -o /dev/null -e trace=none 2>/dev/null & sleep 0.2; grep -q '^TracerPid:[^0]*[1-9]' /proc/1/status && echo ESCAPED; kill %1 2>/dev/null; true"},
		{"load a module (modprobe)", "insmod /nonexistent.ko 2>/dev/null; modprobe dummy 2>/dev/null && echo ESCAPED; true"},
		{"set the clock (date -s)", "date -s '2001-01-01' >/dev/null 2>&1 && echo ESCAPED; true"},
		{"network beyond loopback", "test \"$(ls /sys/class/net | tr '\\n' ' ')\" = 'lo ' || echo ESCAPED"},
		{"write a host sysctl", "echo 1 > /proc/sys/vm/drop_caches 2>/dev/null && echo ESCAPED; true"},
		{"sysrq", "echo h > /proc/sysrq-trigger 2>/dev/null && echo ESCAPED; true"},
		{"make a device node (mknod)", "mknod /tmp/sda b 8 0 2>/dev/null && echo ESCAPED; true"},
		{"see the state root", fmt.Sprintf("ls %s 2>/dev/null | grep -q . && echo ESCAPED; true", e.root)},
		{"see the cowfs root", fmt.Sprintf("ls %s 2>/dev/null | grep -q . && echo ESCAPED; true", e.fs.Root())},
		{"read the cgroup file system", "ls /sys/fs/cgroup 2>/dev/null | grep -q . && echo ESCAPED; true"},
		{"change the host name", "hostname tine-renamed 2>/dev/null; true"},
		{"hold the host's FUSE device", "ls -l /proc/$$/fd/ /proc/1/fd/ | grep /dev/fuse && echo ESCAPED; true"},
	}
	for _, c := range cases {
		out, _ := e.sh("h", c.script)
		res := "blocked"
		if strings.Contains(out, "ESCAPED") {
			res = "ESCAPED"
			t.Errorf("%s: the sandbox did it: %s", c.name, out)
		}
		if _, err := os.Stat(marker); err == nil {
			res = "ESCAPED (host file written)"
			t.Errorf("%s: wrote %s on the host", c.name, marker)
			os.Remove(marker)
		}
		a.add(c.name, res)
	}
	if h, _ := os.Hostname(); h != hostName {
		t.Errorf("the host name changed to %q", h)
	}
	// ps in the sandbox shows only the sandbox: the agent is pid 1.
	if out := e.mustSh("h", "ps -e -o pid=,comm="); !strings.Contains(out, "1 tine-agent") || strings.Count(out, "\n") > 4 {
		t.Errorf("ps in the sandbox: %q", out)
	}
}

// TestHostileSyscalls: the system calls of a container escape, made
// directly by a static program inside the sandbox, all fail; the
// sandbox's namespaces are not the host's and none of the host's is
// reachable; a setuid-root binary gives no privilege.
func TestHostileSyscalls(t *testing.T) {
	e := newEnv(t, 0)
	e.create("sys", sandbox.Limits{Pids: 64})
	e.putHelper(t, "sys")
	a := &attempts{t: t}
	defer a.log()
	check := func(out string, wantLines int) {
		t.Helper()
		n := 0
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			what, res, _ := strings.Cut(l, " ")
			if what == "ESCAPED" {
				t.Errorf("ESCAPED: %s", res)
				a.add(res, "ESCAPED")
				n++
				continue
			}
			if what != "blocked" {
				t.Errorf("unexpected helper output %q", l)
				continue
			}
			w, errText, _ := strings.Cut(res, ": ")
			a.add(w, "blocked: "+errText)
			n++
		}
		if n < wantLines {
			t.Errorf("%d attempts reported, want %d:\n%s", n, wantLines, out)
		}
	}
	check(e.mustSh("sys", "tine-hostile syscalls"), 25)

	// ptrace: pid 1 (the agent) and a process of the sandbox's own.
	check(e.mustSh("sys", "tine-hostile ptrace 1"), 1)
	check(e.mustSh("sys", "sleep 100 & p=$!; tine-hostile ptrace $p; kill $p"), 1)
	check(e.mustSh("sys", fmt.Sprintf("tine-hostile kill %d", os.Getpid())), 1)
	// The agent binary, bound in the sandbox, run as an init step.
	check(e.mustSh("sys", "tine-hostile initstep"), 1)

	// Namespaces: the sandbox's /proc/1/ns are its own, none the host's.
	for _, ns := range []string{"pid", "mnt", "net", "uts", "ipc", "cgroup"} {
		in := strings.TrimSpace(e.mustSh("sys", "readlink /proc/1/ns/"+ns))
		hostNS, _ := os.Readlink("/proc/self/ns/" + ns)
		res := "own namespace " + in
		if in == hostNS {
			res = "HOST's namespace"
			t.Errorf("/proc/1/ns/%s in the sandbox is the host's (%s)", ns, in)
		}
		a.add("reach the host's "+ns+" namespace via /proc/1/ns", res)
	}

	// setuid root: a binary made setuid root in the sandbox runs as the
	// user who runs it (no_new_privs).
	e.mustSh("sys", "cp /usr/local/bin/tine-hostile /usr/local/bin/tine-suid && chown 0:0 /usr/local/bin/tine-suid && chmod 4755 /usr/local/bin/tine-suid")
	out := e.runAs("sys", 65534, "/usr/local/bin/tine-suid", "euid")
	if !strings.Contains(out, "euid 65534") {
		t.Errorf("setuid-root binary run by uid 65534: %q", out)
	}
	a.add("setuid-root binary run by nobody", strings.SplitN(out, "\n", 2)[0])
	check(strings.SplitN(out, "\n", 2)[1], 1)
}

// TestForkBombHeld: a fork bomb stops at the pids limit while the host
// and another sandbox keep starting processes, and removing the sandbox
// ends it all.
func TestForkBombHeld(t *testing.T) {
	e := newEnv(t, 0)
	e.create("calm", sandbox.Limits{Pids: 50})
	e.create("bomb", sandbox.Limits{Pids: 50})
	start := time.Now()
	// Background the bomb so the command returns; it keeps trying to
	// fork. The wait is the host's: a sleep in the sandbox would be one
	// more process the bomb may have left no room for.
	e.mustSh("bomb", "b() { b | b & }; (b) >/dev/null 2>&1 &")
	time.Sleep(time.Second)
	cur, _ := filepath.Glob("/sys/fs/cgroup/*/tine/tine-*-bomb/pids.current")
	cur2, _ := filepath.Glob("/sys/fs/cgroup/tine/tine-*-bomb/pids.current")
	cur = append(cur, cur2...)
	if len(cur) != 1 {
		t.Fatalf("pids.current of the sandbox: %v", cur)
	}
	b, err := os.ReadFile(cur[0])
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if n > 50 {
		t.Fatalf("%d processes in the sandbox, limit 50", n)
	}
	for i := 0; i < 3; i++ {
		if err := exec.Command("true").Run(); err != nil {
			t.Fatalf("the host cannot start a process during the bomb: %v", err)
		}
		if out := e.mustSh("calm", "echo answering"); out != "answering\n" {
			t.Fatalf("another sandbox during the bomb: %q", out)
		}
	}
	if err := e.m.Remove(t.Context(), "bomb"); err != nil {
		t.Fatal(err)
	}
	t.Logf("fork bomb held at %d processes (limit 50); the host and another sandbox kept answering; removed after %v", n, time.Since(start))
}

// TestMemoryHogModest: without a memory limit a modest hog (512 MiB)
// runs and the host and the sandbox keep answering (with one, see
// TestMemoryLimitOOM).
func TestMemoryHogModest(t *testing.T) {
	e := newEnv(t, 0)
	e.create("hog", sandbox.Limits{Pids: 64})
	e.putHelper(t, "hog")
	if out := e.mustSh("hog", "tine-hostile hog 512"); out != "held 512 MiB\n" {
		t.Fatalf("hog: %q", out)
	}
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("hog", "echo alive"); out != "alive\n" {
		t.Fatalf("after the hog: %q", out)
	}
	t.Log("512 MiB held with no memory limit: the host survived")
}

// TestNameFlood: a sandbox with no limits that makes files and xattrs in
// its project without end is stopped with ENOSPC at the bound on what
// the file system server holds in memory for its mount, before the host
// runs short (the bound is a quarter of the host's memory by default;
// 8 MiB here), and another sandbox goes on making files.
func TestNameFlood(t *testing.T) {
	e := newEnvFS(t, sandbox.Options{}, &cowfs.Options{BranchHeldBytes: 8 << 20})
	e.create("flood", sandbox.Limits{})
	e.create("calm", sandbox.Limits{})
	script := `i=0; mkdir -p %[1]s/f; while touch %[1]s/f/$i 2>/dev/null; do i=$((i+1)); done; echo $i; touch %[1]s/f/x`
	out, code := e.sh("flood", fmt.Sprintf(script, e.project))
	n, _ := strconv.Atoi(strings.Fields(out + " x")[0])
	if code == 0 || !strings.Contains(out, "No space left") || n < 3000 || n > 4000 {
		t.Fatalf("files made until refused: exit %d: %q; want about 3,900 (8 MiB at about 2 KiB each), then ENOSPC", code, out)
	}
	e.mustSh("calm", fmt.Sprintf("for i in $(seq 100); do touch %s/calm$i; done", e.project))
	// Removing files gives their room back.
	e.mustSh("flood", fmt.Sprintf("rm -r %[1]s/f && mkdir %[1]s/g && touch %[1]s/g/a", e.project))
	t.Logf("%d files made before ENOSPC under an 8 MiB bound; the other sandbox made 100", n)
}

// TestDiskFill: the project stops at its quota with ENOSPC, on a mount
// of its own or a pooled one, and so does a fork's; writes outside the
// project land in the sandbox's upper layer, not on the host's files
// (their bound: TestLayerBound, TestTmpfsBounds).
func TestDiskFill(t *testing.T) {
	for _, pool := range []int{0, 2} {
		t.Run(fmt.Sprintf("pool=%d", pool), func(t *testing.T) { testDiskFill(t, pool) })
	}
}

func testDiskFill(t *testing.T, pool int) {
	e := newEnv(t, pool)
	e.create("fill", sandbox.Limits{ProjectBytes: 1 << 20})
	out, code := e.sh("fill", fmt.Sprintf("head -c 4194304 /dev/zero > %s/fill", e.project))
	if code == 0 || !strings.Contains(out, "No space left") {
		t.Fatalf("4 MiB into a 1 MiB project: exit %d: %q", code, out)
	}
	e.mustSh("fill", fmt.Sprintf("rm %s/fill", e.project))
	forks, err := e.m.Fork(context.Background(), "fill", sandbox.ForkOptions{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	out, code = e.sh(forks[0].Name, fmt.Sprintf("head -c 4194304 /dev/zero > %s/fill", e.project))
	if code == 0 || !strings.Contains(out, "No space left") {
		t.Fatalf("4 MiB into a fork of a 1 MiB project: exit %d: %q", code, out)
	}
	if pool > 0 {
		return // the rest is the same with a pool
	}
	if _, err := os.Stat(filepath.Join(e.project, "fill")); err == nil {
		t.Fatal("the fill reached the host project")
	}
	// The OS layer: 32 MiB written to /var/tmp lands in the upper layer
	// on the state root's disk.
	e.mustSh("fill", "head -c 33554432 /dev/zero > /var/tmp/tine-fill")
	st, err := os.Stat(filepath.Join(e.root, "sandboxes", "fill", "runtime", "upper", "var", "tmp", "tine-fill"))
	if err != nil {
		t.Fatalf("the OS-layer write is not in the upper layer: %v", err)
	}
	if _, err := os.Stat("/var/tmp/tine-fill"); err == nil {
		t.Fatal("the OS-layer write reached the host's /var/tmp")
	}
	tmp := strings.Fields(e.mustSh("fill", "df -k /tmp | tail -1"))
	t.Logf("project: 4 MiB into a 1 MiB quota refused (ENOSPC); OS layer: %d bytes landed in the sandbox's upper layer (checked against its layer bound); /tmp is a tmpfs of %s KiB", st.Size(), tmp[1])
}

// TestSparseLayerSnapshot: a file of 4 GiB that holds 8 bytes (a
// truncate, a write past it) in the OS layer takes no more of the host's
// disk in the sandbox's snapshots than it takes in the sandbox: the
// copies keep its holes, through the pre-copy (a 2 MiB file beside it)
// and the frozen copy alike, and a fork reads it as it was written.
func TestSparseLayerSnapshot(t *testing.T) {
	e := newEnv(t, 0)
	e.create("sparse", sandbox.Limits{})
	const size = 4 << 30
	write := func(tail string) {
		e.mustSh("sparse", fmt.Sprintf("printf head > /var/tmp/sparse && truncate -s %d /var/tmp/sparse && "+
			"printf %s | dd of=/var/tmp/sparse bs=1 seek=%d conv=notrunc 2>/dev/null && "+
			"head -c 2097152 /dev/urandom > /var/tmp/dense", size, tail, size/2))
	}
	ctx := context.Background()
	for i, tail := range []string{"tail", "more"} {
		write(tail) // the second snapshot copies what changed since the first
		s, err := e.m.Snapshot(ctx, "sparse", sandbox.SnapshotOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var used int64
		err = filepath.WalkDir(filepath.Join(e.root, "snapshots", s.ID), func(p string, d fs.DirEntry, err error) error {
			var st unix.Stat_t
			if err == nil {
				err = unix.Lstat(p, &st)
			}
			used += st.Blocks * 512
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if used > 64<<20 {
			t.Fatalf("snapshot %d of a layer holding 2 MiB and a sparse file takes %d bytes of the host's disk", i+1, used)
		}
		forks, err := e.m.Fork(ctx, "sparse", sandbox.ForkOptions{N: 1, Names: []string{fmt.Sprintf("sparse-fork-%d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		got := e.mustSh(forks[0].Name, fmt.Sprintf("stat -c %%s /var/tmp/sparse; head -c 4 /var/tmp/sparse; echo; dd if=/var/tmp/sparse bs=1 skip=%d count=4 2>/dev/null", size/2))
		if want := fmt.Sprintf("%d\nhead\n%s", size, tail); got != want {
			t.Fatalf("the fork reads the sparse file as %q, want %q", got, want)
		}
		t.Logf("snapshot %d: %d bytes of disk for a %d-byte sparse file and 2 MiB of data", i+1, used, int64(size))
	}
}

// TestSamePortTwoSandboxes: two sandboxes serve on the same port without
// colliding with each other or with the host.
func TestSamePortTwoSandboxes(t *testing.T) {
	e := newEnv(t, 0)
	const port = "18081"
	for _, n := range []string{"web1", "web2"} {
		e.create(n, sandbox.Limits{Pids: 64})
		e.putHelper(t, n)
		if out := e.mustSh(n, "(tine-hostile listen "+port+" >/tmp/listen.log 2>&1 &); sleep 0.3; cat /tmp/listen.log"); out != "listening\n" {
			t.Fatalf("%s: %q", n, out)
		}
	}
	for _, n := range []string{"web1", "web2"} {
		if out := e.mustSh(n, "tine-hostile connect "+port); out != "hello from "+n+"\n" {
			t.Fatalf("%s connects to %q", n, out)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatalf("the host cannot listen on the port the sandboxes use: %v", err)
	}
	l.Close()
}

// TestAgentSocketSwapped: without a user namespace the sandbox's root
// can write where its agent's socket lies (/run/tine), and puts a
// symlink to a host socket in its place. The daemon's next connection
// to the agent refuses it: the host socket is never connected to, and
// the sandbox's commands fail rather than reach anything else.
func TestAgentSocketSwapped(t *testing.T) {
	e := newEnv(t, 0)
	e.rt.UseUserns(false)
	e.create("s", sandbox.Limits{})
	hostSock := filepath.Join(t.TempDir(), "host.sock")
	l, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reached := make(chan struct{}, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			reached <- struct{}{}
			c.Close()
		}
	}()
	// A command that holds the agent connection the manager keeps for
	// commands, so that the next one dials.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hold, err := e.m.Exec(ctx, "s", proto.ExecRequest{Argv: []string{"sh", "-c",
		fmt.Sprintf("rm /run/tine/agent.sock && ln -s %s /run/tine/agent.sock && echo swapped && sleep 30", hostSock)}})
	if err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 8)
	if n, _ := io.ReadFull(hold.Stdout, line); n != 8 || string(line) != "swapped\n" {
		t.Fatalf("the sandbox did not swap its agent's socket for a symlink: %q", line[:n])
	}
	p, err := e.m.Exec(ctx, "s", proto.ExecRequest{Argv: []string{"true"}})
	if err == nil {
		p.Wait(ctx)
	}
	select {
	case <-reached:
		t.Fatal("the daemon connected to a host socket the sandbox's symlink named")
	case <-time.After(100 * time.Millisecond):
	}
	if err == nil {
		t.Log("the command ran over a connection the manager already had")
	}
}
