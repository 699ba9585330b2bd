package vm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"tine/chunkstore"
	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// Environment of TestRuntimeGuest, set by vmm/nested's
// TestVMRuntimeUnderKVM in L1, where KVM is real.
const (
	EnvKernel  = "TINE_VM_KERNEL"
	EnvModules = "TINE_VM_MODULES"
	EnvAgent   = "TINE_VM_AGENT"
	EnvBusybox = "TINE_VM_BUSYBOX"
	// EnvUnixcat is a static program the guest's commands use to talk
	// to a Unix socket (busybox's nc has none): vmm/nested's
	// testdata/unixcat.
	EnvUnixcat = "TINE_VM_UNIXCAT"
)

// TestRuntimeGuest runs the vm runtime as the sandbox manager does:
// Start boots Linux with the agent, exec and a listener through the
// agent socket, then Freeze, CopyState, Thaw and 3 Starts from that
// state; each clone answers exec through its own socket with the state
// made before the fork, its own generation and RNG output, and still
// serves the listener, and is stopped (its state keeps its disk, not the
// image). Every machine's commands reach its own inside API: HTTP over
// /run/tine/api.sock reaches the server on the host socket given as its
// Spec.APISocket. Then the parent stops and TestRuntimeCloneInNewProcess
// runs in a new process.
func TestRuntimeGuest(t *testing.T) {
	if os.Getenv(EnvKernel) == "" {
		t.Skipf("needs a real KVM: run through vmm/nested's TestVMRuntimeUnderKVM (%s unset)", EnvKernel)
	}
	dir := t.TempDir()
	r, err := New(Config{Kernel: os.Getenv(EnvKernel), Modules: os.Getenv(EnvModules), Agent: os.Getenv(EnvAgent),
		Busybox: os.Getenv(EnvBusybox), MemSize: 256 << 20, StoreDir: filepath.Join(dir, "store"), NoHostFilter: noNft()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	// The project: a host directory standing in for the sandbox's cowfs
	// branch, mounted in the guest at its own path.
	proj := filepath.Join(dir, "proj")
	if err := os.MkdirAll(proj, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proj, "from-host"), []byte("host file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	parent, err := r.Start(ctx, sandbox.Spec{ID: "p", Dir: filepath.Join(dir, "p"), APISocket: apiServer(t, dir, "p"),
		ProjectPath: proj, ProjectSource: proj})
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "p", "console.log"))
		t.Fatalf("%v\nconsole:\n%s", err, b)
	}
	defer parent.Stop(context.Background())
	t.Logf("booted to the agent in %v", time.Since(t0))
	sh := func(in sandbox.Instance, script string) string {
		t.Helper()
		c, err := client.Dial(ctx, in.AgentSocket())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(p.Stdout)
		if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 {
			t.Fatalf("%q: %+v %v (output %q)", script, ex, err, out)
		}
		return string(out)
	}
	parentMAC, parentIP := checkNet(ctx, t, parent, false)
	api := putUnixcat(ctx, t, parent)
	checkAPI := func(in sandbox.Instance, who string) {
		t.Helper()
		if !api {
			return
		}
		// 200000 bytes each way: more than one window of credit.
		out := sh(in, "{ printf 'POST /ask HTTP/1.0\\r\\nContent-Length: 200000\\r\\n\\r\\n'; head -c 200000 /dev/zero; } | /tmp/unixcat /run/tine/api.sock > /tmp/answer; "+
			"head -1 /tmp/answer; grep '^api of' /tmp/answer; tail -c 200000 /tmp/answer | tr -cd y | wc -c")
		if f := strings.Fields(out); len(f) != 9 || f[1] != "200" || strings.Join(f[3:8], " ") != "api of "+who+" read 200000" || f[8] != "200000" {
			t.Errorf("%s: HTTP over /run/tine/api.sock answered %q", who, out)
		} else {
			t.Logf("%s: HTTP over /run/tine/api.sock answered %q", who, out)
		}
	}
	checkAPI(parent, "p")
	out := sh(parent, "echo hi-from-exec; cat /run/tine/generation")
	gen0, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(out), "hi-from-exec\n"), 10, 64)
	if !strings.HasPrefix(out, "hi-from-exec\n") || err != nil || gen0 == 0 {
		t.Fatalf("exec in the parent: %q", out)
	}
	// The project is mounted at its path: the host's file is there, and
	// a file the guest writes lands in the host directory.
	if out := sh(parent, "cat "+proj+"/from-host; echo guest-wrote > "+proj+"/from-guest; sync"); out != "host file\n" {
		t.Fatalf("the project in the guest: %q", out)
	}
	if b, err := os.ReadFile(filepath.Join(proj, "from-guest")); err != nil || string(b) != "guest-wrote\n" {
		t.Fatalf("the guest's file on the host: %q %v", b, err)
	}
	sh(parent, "head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /root/state; setsid nc -ll -p 8080 -e echo served </dev/null >/dev/null 2>&1 &")
	state := sh(parent, "cat /root/state")
	for deadline := time.Now().Add(time.Minute); ; {
		if strings.Contains(sh(parent, "netstat -ltn"), ":8080") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the listener did not start")
		}
		time.Sleep(time.Second)
	}
	if got := dialServed(t, parent.(*Instance).GuestAddr()); got != "served" {
		t.Errorf("the parent's listener at %s answered the host %q", parent.(*Instance).GuestAddr(), got)
	}
	macs := map[string]string{parentMAC: "the parent"}
	ips := map[string]string{parentIP: "the parent"}
	snap := filepath.Join(dir, "snap")
	if err := parent.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	err = r.CopyState(ctx, filepath.Join(dir, "p"), snap)
	if err == nil {
		// The snapshot's branch: what the manager's cowfs fork makes.
		err = os.CopyFS(filepath.Join(dir, "snapproj"), os.DirFS(proj))
	}
	parent.Thaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	var kids []sandbox.Instance
	lastGen := gen0
	for i := 1; i <= 3; i++ {
		t1 := time.Now()
		name := "c" + strconv.Itoa(i)
		cproj := filepath.Join(dir, "cproj"+strconv.Itoa(i))
		if err := os.CopyFS(cproj, os.DirFS(filepath.Join(dir, "snapproj"))); err != nil {
			t.Fatal(err)
		}
		k, err := r.Start(ctx, sandbox.Spec{ID: name, Dir: filepath.Join(dir, name), Seed: snap, APISocket: apiServer(t, dir, name),
			ProjectPath: proj, ProjectSource: cproj})
		if err != nil {
			b, _ := os.ReadFile(filepath.Join(dir, "c"+strconv.Itoa(i), "console.log"))
			t.Fatalf("clone %d: %v\nconsole:\n%s", i, err, b)
		}
		checkAPI(k, name)
		kids = append(kids, k)
		t.Logf("clone %d: started and hygiene applied in %v", i, time.Since(t1))
		mac, ip := checkNet(ctx, t, k, true)
		if who, dup := macs[mac]; dup {
			t.Errorf("clone %d has MAC %s, as %s has", i, mac, who)
		}
		if who, dup := ips[ip]; dup {
			t.Errorf("clone %d has address %s, as %s has", i, ip, who)
		}
		macs[mac], ips[ip] = "clone "+strconv.Itoa(i), "clone "+strconv.Itoa(i)
		out := sh(k, "cat /run/tine/generation /root/state; echo; sleep 3 | nc 127.0.0.1 8080; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s")
		f := strings.Split(strings.TrimSpace(out), "\n")
		if len(f) != 5 {
			t.Fatalf("clone %d answered %q", i, out)
		}
		if g, _ := strconv.ParseUint(f[0], 10, 64); g <= lastGen {
			t.Errorf("clone %d: generation %q, not above the one before (%d)", i, f[0], lastGen)
		} else {
			lastGen = g
		}
		if f[1] != state {
			t.Errorf("clone %d: state %q, the parent made %q", i, f[1], state)
		}
		if f[2] != "served" {
			t.Errorf("clone %d: the listener answered %q", i, f[2])
		}
		if j, dup := seen[f[3]]; dup || len(f[3]) != 32 {
			t.Errorf("clone %d: RNG output %q, the same as %s", i, f[3], j)
		}
		seen[f[3]] = strconv.Itoa(i)
		// The clone's project is its own branch, remounted at the same
		// path: it has the parent's file, and what it writes stays in
		// its branch.
		if out := sh(k, "cat "+proj+"/from-guest; echo clone > "+proj+"/from-clone; sync"); out != "guest-wrote\n" {
			t.Errorf("clone %d: the project holds %q", i, out)
		}
		if _, err := os.Stat(filepath.Join(cproj, "from-clone")); err != nil {
			t.Errorf("clone %d: its file is not in its branch: %v", i, err)
		}
		if _, err := os.Stat(filepath.Join(proj, "from-clone")); !os.IsNotExist(err) {
			t.Errorf("clone %d: its file reached the parent's branch: %v", i, err)
		}
		if s, _ := strconv.ParseInt(f[4], 10, 64); time.Since(time.Unix(s, 0)).Abs() > 2*time.Minute {
			t.Errorf("clone %d: wall clock %s, host %s", i, time.Unix(s, 0), time.Now())
		}
		// Stop it (fewer machines share the emulated CPUs): its state
		// keeps the disk and drops the image it was cloned from.
		tap := k.(*Instance).TapName()
		if err := k.Stop(ctx); err != nil {
			t.Errorf("stop clone %d: %v", i, err)
		}
		if _, err := net.InterfaceByName(tap); err == nil {
			t.Errorf("stopped clone %d still has its TAP %s", i, tap)
		}
		cdir := filepath.Join(dir, "c"+strconv.Itoa(i))
		if m, err := readManifest(cdir); err != nil || m.Image || m.Disk == "" {
			t.Errorf("stopped clone %d: manifest %+v %v", i, m, err)
		}
		if _, err := os.Stat(filepath.Join(cdir, imageDir)); !os.IsNotExist(err) {
			t.Errorf("stopped clone %d still holds its image: %v", i, err)
		}
	}
	// The parent goes on with its own state and network.
	if out := sh(parent, "cat /root/state /run/tine/generation"); out != state+strconv.FormatUint(gen0, 10)+"\n" {
		t.Errorf("parent after the fork: %q", out)
	}
	if mac, ip := checkNet(ctx, t, parent, true); mac != parentMAC || ip != parentIP {
		t.Errorf("parent after the fork: MAC %s address %s, before %s %s", mac, ip, parentMAC, parentIP)
	}
	checkAPI(parent, "p")
	// A new process (a restarted daemon) opens the runtime on the same
	// store and clones the memory image on disk.
	for _, k := range append(kids, parent) {
		if err := k.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestRuntimeCloneInNewProcess$", "-test.v", "-test.timeout", "5m")
	cmd.Env = append(os.Environ(), envRestart+"="+dir+","+state+","+strconv.FormatUint(lastGen, 10))
	b, err := cmd.CombinedOutput()
	t.Logf("new process:\n%s", b)
	if err != nil || !strings.Contains(string(b), "--- PASS: TestRuntimeCloneInNewProcess") {
		t.Fatalf("clone in a new process: %v", err)
	}
}

// envRestart carries TestRuntimeGuest's directory, the parent's state and
// the last generation given to TestRuntimeCloneInNewProcess.
const envRestart = "TINE_VM_RESTART"

// TestRuntimeCloneInNewProcess is run by TestRuntimeGuest in a new
// process: it opens the runtime on the store of that test and starts a
// clone of the snapshot saved there. The clone keeps the parent's file
// and listener, gets a generation above any given before, and the stopped
// parent's disk is still in the store.
func TestRuntimeCloneInNewProcess(t *testing.T) {
	arg := os.Getenv(envRestart)
	if arg == "" {
		t.Skipf("run by TestRuntimeGuest (%s unset)", envRestart)
	}
	f := strings.Split(arg, ",")
	if len(f) != 3 {
		t.Fatalf("%s=%q", envRestart, arg)
	}
	dir, state := f[0], f[1]
	last, _ := strconv.ParseUint(f[2], 10, 64)
	r, err := New(Config{Kernel: os.Getenv(EnvKernel), Modules: os.Getenv(EnvModules), Agent: os.Getenv(EnvAgent),
		Busybox: os.Getenv(EnvBusybox), MemSize: 256 << 20, StoreDir: filepath.Join(dir, "store"), NoHostFilter: noNft()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	m, err := readManifest(filepath.Join(dir, "p"))
	if err != nil || m.Image || m.Disk == "" {
		t.Fatalf("stopped parent's manifest %+v %v", m, err)
	}
	id, _ := chunkstore.ParseID(m.Disk)
	if !r.store.Has(id) {
		t.Fatal("the stopped parent's disk is not in the store")
	}
	t1 := time.Now()
	proj, nproj := filepath.Join(dir, "proj"), filepath.Join(dir, "n1proj")
	if err := os.CopyFS(nproj, os.DirFS(filepath.Join(dir, "snapproj"))); err != nil {
		t.Fatal(err)
	}
	k, err := r.Start(ctx, sandbox.Spec{ID: "n1", Dir: filepath.Join(dir, "n1"), Seed: filepath.Join(dir, "snap"),
		ProjectPath: proj, ProjectSource: nproj})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop(context.Background())
	t.Logf("clone from the image on disk: started and hygiene applied in %v", time.Since(t1))
	checkNet(ctx, t, k, true)
	c, err := client.Dial(ctx, k.AgentSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /run/tine/generation /root/state; echo; sleep 3 | nc 127.0.0.1 8080; cat " + proj + "/from-guest"}, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout)
	if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 {
		t.Fatalf("exec: %+v %v (output %q)", ex, err, out)
	}
	g := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(g) != 4 {
		t.Fatalf("the clone answered %q", out)
	}
	if gen, _ := strconv.ParseUint(g[0], 10, 64); gen <= last {
		t.Errorf("generation %s, not above %d given by the earlier process", g[0], last)
	}
	if g[1] != state {
		t.Errorf("state %q, the parent made %q", g[1], state)
	}
	if g[2] != "served" {
		t.Errorf("the listener answered %q", g[2])
	}
	if g[3] != "guest-wrote" {
		t.Errorf("the project in the clone holds %q", g[3])
	}
}

// checkNet reads the guest's network identity through its agent (every
// interface's MAC under /sys/class/net, eth0's IPv4 addresses) and checks
// it is the one the runtime gave the machine: eth0 with its MAC and only
// its address, no other interface with a MAC but lo's zeros. With
// listener, the host also reaches the guest's TCP listener on port 8080
// at that address. It returns the MAC and the address.
func checkNet(ctx context.Context, t *testing.T, in sandbox.Instance, listener bool) (string, string) {
	t.Helper()
	vi := in.(*Instance)
	c, err := client.Dial(ctx, in.AgentSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	script := "for i in /sys/class/net/*; do echo ${i##*/} $(cat $i/address); done; ip -4 addr show dev eth0 | awk '/inet /{print \"inet\", $2}'"
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout)
	if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 {
		t.Fatalf("network identity: %+v %v (output %q)", ex, err, out)
	}
	var mac, ip string
	var inets []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 2 && f[0] == "inet":
			inets = append(inets, f[1])
		case len(f) == 2 && f[0] == GuestInterface:
			mac = f[1]
		case len(f) == 2 && f[0] == "lo":
		default:
			t.Errorf("unexpected line in the guest's network identity: %q", l)
		}
	}
	want := vi.GuestAddr().String() + "/30"
	if mac != vi.MAC().String() || len(inets) != 1 || inets[0] != want {
		t.Fatalf("the guest reports MAC %q and addresses %v; the runtime gave it %s and %s (output %q)", mac, inets, vi.MAC(), want, out)
	}
	ip = vi.GuestAddr().String()
	if listener {
		if got := dialServed(t, vi.GuestAddr()); got != "served" {
			t.Errorf("the listener at %s answered the host %q", ip, got)
		}
	}
	t.Logf("guest network: %s MAC %s address %s, host end %s", vi.TapName(), mac, want, vi.HostAddr())
	return mac, ip
}

// dialServed connects to port 8080 at addr from the host and returns what
// the listener sent before closing.
func dialServed(t *testing.T, addr netip.Addr) string {
	t.Helper()
	var last error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, 8080).String(), 10*time.Second)
		if err != nil {
			last = err
			continue
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			last = err
			continue
		}
		return strings.TrimSpace(string(b))
	}
	return "nothing: " + last.Error()
}

// noNft reports a host without nft (the nested harness's L1): the
// machines there run without the host's filter, which TestHostFilter
// checks where nft is.
func noNft() bool {
	_, err := exec.LookPath("nft")
	return err != nil
}

// apiServer serves HTTP on a new Unix socket in dir, as the daemon's
// inside API serves a sandbox, and returns its path: every request's
// answer names the sandbox and how many body bytes it read, then holds
// 200000 bytes of 'y'.
func apiServer(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name+"-api.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "api of %s read %d\n", name, n)
		w.Write(bytes.Repeat([]byte("y"), 200000))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return path
}

// putUnixcat copies the program of EnvUnixcat to /tmp/unixcat in the
// guest and reports whether it did; without it the inside API is not
// checked.
func putUnixcat(ctx context.Context, t *testing.T, in sandbox.Instance) bool {
	t.Helper()
	p := os.Getenv(EnvUnixcat)
	if p == "" {
		t.Logf("%s unset: the inside API is not checked", EnvUnixcat)
		return false
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := client.Dial(ctx, in.AgentSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.PutFile(ctx, "/tmp/unixcat", 0o755, f); err != nil {
		t.Fatal(err)
	}
	return true
}
