package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// TestManagerGuest drives a vm sandbox through sandbox.Manager, as the
// daemon does, with the project a cowfs branch mounted on the host and
// served into the guest by the share: Create from a host directory;
// Exec reads and changes the project at its own path with
// TINE_API_SOCKET in its environment (the inside API answers the
// sandbox by name); Ps and Ports list a background sleep and a
// listener; Diff lists the guest's changes as for an ns sandbox;
// Snapshot, later changes (project, guest memory, raw disk) and Rollback
// bring back all three as they were; Fork into 2, each with the state
// before the fork and its own change only, in its Diff too; Promote of
// one fork writes its changes into the host directory; a fork taken
// while a process holds a file open in the project goes on in the fork,
// writing into the fork's branch only, and in the parent across a
// rollback; the parent stops while its forks run. It needs a real
// KVM and FUSE: vmm/nested's TestVMRuntimeUnderKVM runs it in L1.
func TestManagerGuest(t *testing.T) {
	if os.Getenv(EnvKernel) == "" {
		t.Skipf("needs a real KVM: run through vmm/nested's TestVMRuntimeUnderKVM (%s unset)", EnvKernel)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("needs FUSE for the project's cowfs mount: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	r, err := New(Config{Kernel: os.Getenv(EnvKernel), Modules: os.Getenv(EnvModules), Agent: os.Getenv(EnvAgent),
		Busybox: os.Getenv(EnvBusybox), MemSize: 256 << 20, StoreDir: filepath.Join(root, "vm-store"), NoHostFilter: noNft()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fs, err := cowfs.Open(filepath.Join(dir, "cowfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	m, err := sandbox.Open(ctx, root, fs, sandbox.Options{Runtime: r})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	m.SetInsideAPI(&namedAPI{servers: map[string]*http.Server{}})

	proj := filepath.Join(dir, "proj")
	for name, data := range map[string]string{"README": "one\n", "src/main.txt": "v1\n"} {
		p := filepath.Join(proj, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	if _, err := m.Create(ctx, sandbox.CreateOptions{Name: "p", Dir: proj}); err != nil {
		t.Fatal(err)
	}
	t.Logf("created and booted in %v", time.Since(t0))

	// run execs script through the Manager in the sandbox (its project
	// directory unless wd is given) and returns its output.
	run := func(name, wd, script string) string {
		t.Helper()
		p, err := m.Exec(ctx, name, proto.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, Dir: wd, Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatalf("exec in %s: %v", name, err)
		}
		var stderr []byte
		done := make(chan struct{})
		go func() { stderr, _ = io.ReadAll(p.Stderr); close(done) }()
		out, _ := io.ReadAll(p.Stdout)
		<-done
		if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 {
			t.Fatalf("%s: %q: %+v %v (output %q, errors %q)", name, script, ex, err, out, stderr)
		}
		return string(out)
	}
	diff := func(name, snap string) string {
		t.Helper()
		changes, err := m.Diff(ctx, name, snap)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range changes {
			got = append(got, c.Kind.String()+" "+c.Path)
		}
		return strings.Join(got, ",")
	}

	// Exec: the project at its own path, the inside API's socket.
	if out, want := run("p", "", "pwd; cat README src/main.txt; echo $TINE_API_SOCKET"), proj+"\none\nv1\n"+sandbox.InsideSocket+"\n"; out != want {
		t.Fatalf("exec in the project: %q, want %q", out, want)
	}
	// The unixcat in the guest's /tmp is in its memory: the rollback
	// and the forks keep it.
	api := os.Getenv(EnvUnixcat) != ""
	if api {
		f, err := os.Open(os.Getenv(EnvUnixcat))
		if err != nil {
			t.Fatal(err)
		}
		c, err := m.Agent(ctx, "p")
		if err == nil {
			err = c.PutFile(ctx, "/tmp/unixcat", 0o755, f)
		}
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	askAPI := func(name string) {
		t.Helper()
		if !api {
			return
		}
		out := run(name, "/", `printf 'GET /who HTTP/1.0\r\n\r\n' | /tmp/unixcat "$TINE_API_SOCKET" | tail -1`)
		if want := "api of " + name; strings.TrimSpace(out) != want {
			t.Errorf("%s: the inside API answered %q, want %q", name, out, want)
		}
	}
	askAPI("p")
	run("p", "", "echo added > added.txt; echo v2 > src/main.txt")
	// Processes started outside the project (a process inside it at a
	// fork blocks the clone's remount of the share: docs/sandboxes.md).
	run("p", "/", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & setsid nc -ll -p 8080 -e echo served </dev/null >/dev/null 2>&1 &")
	checkPsPorts := func(name string) {
		t.Helper()
		c, err := m.Agent(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := c.Ps(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(ps, func(p proto.Process) bool { return strings.Join(p.Argv, " ") == "sleep 1000" }) {
			t.Errorf("%s: ps does not list the background sleep: %+v", name, ps)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
			ports, err := c.Ports(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(ports, func(p proto.Port) bool { return p.Port == 8080 && strings.HasPrefix(p.Proto, "tcp") }) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: ports does not list the listener on 8080: %+v", name, ports)
				break
			}
		}
	}
	checkPsPorts("p")
	if got, want := diff("p", ""), "added added.txt,modified src/main.txt"; got != want {
		t.Errorf("diff after the guest's changes = %q, want %q", got, want)
	}

	// Snapshot, more changes, Rollback: project, memory and disk are back.
	run("p", "/", "echo mem1 > /tmp/mem; printf disk1 | dd of=/dev/vda bs=512 seek=1 conv=notrunc 2>/dev/null; sync")
	t1 := time.Now()
	if _, err := m.Snapshot(ctx, "p", sandbox.SnapshotOptions{Name: "s1"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot in %v", time.Since(t1))
	run("p", "", "echo v3 > src/main.txt; echo later > later.txt; rm README; echo mem2 > /tmp/mem; echo x > /tmp/later; "+
		"printf disk2 | dd of=/dev/vda bs=512 seek=1 conv=notrunc 2>/dev/null; sync")
	if got, want := diff("p", "s1"), "deleted README,added later.txt,modified src/main.txt"; got != want {
		t.Errorf("diff since the snapshot = %q, want %q", got, want)
	}
	t1 = time.Now()
	if err := m.Rollback(ctx, "p", "s1"); err != nil {
		t.Fatal(err)
	}
	t.Logf("rollback in %v", time.Since(t1))
	state := "cat README src/main.txt; ls; cat /tmp/mem; test -e /tmp/later && echo later-in-tmp; " +
		"echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vda bs=512 skip=1 count=1 2>/dev/null | head -c 5; echo"
	if out, want := run("p", "", state), "one\nv2\nREADME\nadded.txt\nsrc\nmem1\ndisk1\n"; out != want {
		t.Errorf("after the rollback: %q, want %q", out, want)
	}
	if got, want := diff("p", ""), "added added.txt,modified src/main.txt"; got != want {
		t.Errorf("diff after the rollback = %q, want %q", got, want)
	}
	checkPsPorts("p")
	askAPI("p")

	// Fork into 2: each has the change made before the fork and its own.
	run("p", "", "echo base > base.txt")
	t1 = time.Now()
	forks, err := m.Fork(ctx, "p", sandbox.ForkOptions{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("forked into 2 in %v", time.Since(t1))
	for i, f := range forks {
		own := fmt.Sprintf("own-%d.txt", i+1)
		run(f.Name, "", "echo "+f.Name+" > "+own)
	}
	for i, f := range forks {
		own := fmt.Sprintf("own-%d.txt", i+1)
		if out, want := run(f.Name, "", "cat base.txt; ls own-*; cat /tmp/mem"), "base\n"+own+"\nmem1\n"; out != want {
			t.Errorf("%s: %q, want %q", f.Name, out, want)
		}
		if got, want := diff(f.Name, ""), "added "+own; got != want {
			t.Errorf("%s: diff = %q, want %q", f.Name, got, want)
		}
		checkPsPorts(f.Name)
		askAPI(f.Name)
	}
	if out := run("p", "", "ls"); out != "README\nadded.txt\nbase.txt\nsrc\n" {
		t.Errorf("the parent after the fork: %q", out)
	}

	// Promote the first fork into the host directory.
	res, err := m.Promote(ctx, forks[0].Name, sandbox.PromoteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("promoted %s: %d change(s) into %s", forks[0].Name, len(res.Changes), res.Dir)
	for name, want := range map[string]string{"README": "one\n", "src/main.txt": "v2\n", "added.txt": "added\n",
		"base.txt": "base\n", "own-1.txt": forks[0].Name + "\n", "own-2.txt": "", "later.txt": ""} {
		b, err := os.ReadFile(filepath.Join(proj, name))
		if want == "" {
			if !errors.Is(err, os.ErrNotExist) {
				t.Errorf("host %s after the promotion: %q %v, want none", name, b, err)
			}
		} else if string(b) != want {
			t.Errorf("host %s after the promotion: %q %v, want %q", name, b, err, want)
		}
	}
	// A process with its working directory and an open file in the
	// project (a plain exec's default) goes on in a fork: the clone's
	// share carries the parent's node ids and file handles over to the
	// fork's own branch. It waits for a file named go in its working
	// directory, then writes through the file it holds open.
	run("p", "", "echo start > held.log; setsid sh -c 'exec 3>>held.log; until [ -e go ]; do sleep 0.2; done; echo written >&3' </dev/null >/dev/null 2>&1 &")
	t1 = time.Now()
	qs, err := m.Fork(ctx, "p", sandbox.ForkOptions{N: 1, Names: []string{"q"}})
	if err != nil {
		t.Fatalf("fork with a process in the project: %v", err)
	}
	t.Logf("forked with a process in the project in %v", time.Since(t1))
	q := qs[0].Name
	if out := run(q, "", "touch go; for i in $(seq 50); do grep -q written held.log && break; sleep 0.2; done; cat held.log"); out != "start\nwritten\n" {
		t.Errorf("%s: the process held over the fork wrote %q, want start and written", q, out)
	}
	if got := diff(q, ""); got != "added go,modified held.log" {
		t.Errorf("%s: diff = %q, want the trigger added and held.log modified", q, got)
	}
	if out := run("p", "", "cat held.log; ls go 2>&1 >/dev/null | wc -l"); out != "start\n1\n" {
		t.Errorf("the parent after its fork's process wrote: %q", out)
	}
	// A rollback with that process in the project: the parent's own
	// process writes, the parent rolls back to before it did, and the
	// process, waiting again, writes again.
	if _, err := m.Snapshot(ctx, "p", sandbox.SnapshotOptions{Name: "held"}); err != nil {
		t.Fatalf("snapshot with a process in the project: %v", err)
	}
	wake := "touch go; for i in $(seq 50); do grep -q written held.log && break; sleep 0.2; done; cat held.log"
	if out := run("p", "", wake); out != "start\nwritten\n" {
		t.Errorf("the parent's held process wrote %q", out)
	}
	t1 = time.Now()
	if err := m.Rollback(ctx, "p", "held"); err != nil {
		t.Fatalf("rollback with a process in the project: %v", err)
	}
	t.Logf("rolled back with a process in the project in %v", time.Since(t1))
	if out := run("p", "", "cat held.log; ls go 2>&1 >/dev/null | wc -l"); out != "start\n1\n" {
		t.Errorf("the parent after the rollback: %q", out)
	}
	if out := run("p", "", wake); out != "start\nwritten\n" {
		t.Errorf("the held process after the rollback wrote %q", out)
	}
	// The parent stops while its forks run: the project's mount goes
	// although the forks' share servers started after it.
	t1 = time.Now()
	if err := m.Stop(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped the parent, its forks running, in %v", time.Since(t1))
	if out := run(forks[1].Name, "", "cat own-2.txt"); out != forks[1].Name+"\n" {
		t.Errorf("%s after the parent stopped: %q", forks[1].Name, out)
	}
}

// namedAPI is an inside API whose every answer names the sandbox whose
// socket the request came in on.
type namedAPI struct {
	mu      sync.Mutex
	servers map[string]*http.Server
}

// Listen implements sandbox.InsideAPI.
func (a *namedAPI) Listen(name, path string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.servers[name]; ok {
		return nil
	}
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "api of %s\n", name)
	})}
	go srv.Serve(l)
	a.servers[name] = srv
	return nil
}

// Forget implements sandbox.InsideAPI.
func (a *namedAPI) Forget(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.servers[name]; s != nil {
		s.Close()
		delete(a.servers, name)
	}
}
