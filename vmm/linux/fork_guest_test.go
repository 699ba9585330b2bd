package linux

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"tine/chunkstore"
	"tine/guestagent"
	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/vmm/disk"
	"tine/vmm/virtio"
)

// guestServer is the guest side of TestVirtioGuestFork: a vsock server
// started before the fork, holding state made before it, that answers
// "get" (its state, 16 bytes of the kernel RNG, the wall clock, the
// generation), "hygiene HEX NANOS GEN" (guestagent.ApplyHygiene) and
// "exit".
func guestServer(t *testing.T, l net.Listener) {
	// The guest agent, on its own vsock port, as the vm runtime runs it.
	a, err := guestagent.New(guestagent.Config{})
	if err != nil {
		t.Fatal(err)
	}
	al, err := guestagent.ListenVsock(guestAgentPort)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	go a.Serve(al)
	var st [8]byte
	rand.Read(st[:])
	state := "made-before-fork-" + hex.EncodeToString(st[:])
	done := make(chan struct{})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					f := strings.Fields(line)
					switch {
					case len(f) == 1 && f[0] == "get":
						b := make([]byte, 16)
						u, _ := os.Open("/dev/urandom")
						io.ReadFull(u, b)
						u.Close()
						gen, _ := os.ReadFile(guestagent.GenerationFile)
						fmt.Fprintf(c, "state=%s rng=%x time=%d gen=%s\n", state, b, time.Now().UnixNano(), strings.TrimSpace(string(gen)))
					case len(f) == 4 && f[0] == "hygiene":
						ent, _ := hex.DecodeString(f[1])
						ns, _ := strconv.ParseInt(f[2], 10, 64)
						gen, _ := strconv.ParseUint(f[3], 10, 64)
						if err := guestagent.ApplyHygiene("/", guestagent.Hygiene{Entropy: ent, Now: time.Unix(0, ns), Generation: gen}); err != nil {
							fmt.Fprintf(c, "err %v\n", err)
						} else {
							fmt.Fprintf(c, "ok\n")
						}
					case len(f) == 1 && f[0] == "exit":
						fmt.Fprintf(c, "bye\n")
						close(done)
						return
					default:
						fmt.Fprintf(c, "err unknown command\n")
					}
				}
			}()
		}
	}()
	<-done
}

// ask sends one command through a VM's vsock socket and returns the
// answer line, retrying the connection (after TRANSPORT_RESET the guest
// listener is there again at once, the host side may need a moment).
func ask(sock, cmd string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(c, "CONNECT %d\n", guestEchoPort)
			r := bufio.NewReader(c)
			line, err := r.ReadString('\n')
			if err == nil && strings.HasPrefix(line, "OK ") {
				fmt.Fprintf(c, "%s\n", cmd)
				ans, err := r.ReadString('\n')
				c.Close()
				if err == nil {
					return strings.TrimSpace(ans), nil
				}
				last = err
			} else {
				c.Close()
				last = fmt.Errorf("handshake %q: %v", line, err)
			}
		} else {
			last = err
		}
		time.Sleep(300 * time.Millisecond)
	}
	return "", fmt.Errorf("%s on %s: %v", cmd, sock, last)
}

func field(ans, key string) string {
	for _, f := range strings.Fields(ans) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestVirtioGuestFork boots Linux with a vsock server holding state,
// forks the machine into 3 clones with their disks, and checks the fork
// hygiene contract: each clone answers on its own socket with the state
// made before the fork, and after the hygiene step reads its own RNG
// output, has a wall clock within 1 s of the host's and its own
// generation.
func TestVirtioGuestFork(t *testing.T) {
	kernelPath, initrdPath := os.Getenv(envL2Kernel), os.Getenv(envL2Initrd)
	if kernelPath == "" {
		t.Skipf("needs a real KVM and a guest: run through vmm/nested's TestVirtioUnderKVM (%s unset)", envL2Kernel)
	}
	kernel, _ := os.ReadFile(kernelPath)
	initrd, _ := os.ReadFile(initrdPath)
	store, err := chunkstore.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	img, _ := disk.New(store, 8<<20)
	dir := t.TempDir()
	vs := &virtio.Vsock{GuestCID: 3}
	m, err := NewMachine(context.Background(), MachineConfig{
		Kernel: kernel, Initrd: initrd, MemSize: 256 << 20,
		Cmdline: "console=ttyS0 panic=-1 quiet tine.fork", Console: os.Stdout,
		Virtio: []virtio.Device{&virtio.RNG{}, &virtio.Console{}, &virtio.Block{Disk: img}, vs},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sock0 := filepath.Join(dir, "vm0.sock")
	if err := vs.Listen(m.Virtio[3], sock0); err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	runs := make(chan error, 4)
	go func() { runs <- m.Run(ctx) }()
	before, err := ask(sock0, "get", 4*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("parent before the fork: %s", before)
	// Through the agent over vsock: exec, a listener started in the
	// guest seen by ports, and ps.
	agent := func(sock string) *client.Client {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			c, err := dialAgent(ctx, sock)
			if err == nil {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent through %s: %v", sock, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	ac := agent(sock0)
	if out := execOut(t, ctx, ac, "/bin/busybox", "echo", "hi-from-exec"); out != "hi-from-exec\n" {
		t.Fatalf("exec output %q", out)
	}
	execOut(t, ctx, ac, "/bin/busybox", "sh", "-c", "/bin/busybox setsid /bin/busybox nc -ll -p 8080 -e /bin/busybox echo served </dev/null >/dev/null 2>&1 &")
	hasListener := func(c *client.Client) bool {
		ports, err := c.Ports(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ports {
			if p.Port == 8080 && strings.HasPrefix(p.Proto, "tcp") {
				return true
			}
		}
		return false
	}
	waitUntil := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !f(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	waitUntil("port 8080 in the agent's ports", func() bool { return hasListener(ac) })
	if out := execOut(t, ctx, ac, "/bin/busybox", "sh", "-c", "/bin/busybox sleep 5 | /bin/busybox nc 127.0.0.1 8080"); out != "served\n" {
		t.Fatalf("the listener in the parent answered %q", out)
	}
	procs, err := ac.Ps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		found = found || strings.Contains(strings.Join(p.Argv, " "), "nc -ll -p 8080")
	}
	if !found {
		t.Errorf("ps does not list the listener: %+v", procs)
	}
	ac.Close()

	var disks []*disk.Image
	var socks []string
	var clones []*virtio.Vsock
	kids, err := m.Fork(ctx, 3, ForkConfig{
		Prepare: func() (err error) { disks, err = img.Fork(3); return err },
		Devices: func(i int) ([]virtio.Device, error) {
			v := &virtio.Vsock{GuestCID: 3}
			clones = append(clones, v)
			return []virtio.Device{&virtio.RNG{}, &virtio.Console{}, &virtio.Block{Disk: disks[i-1]}, v}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range kids {
		defer k.Close()
		s := filepath.Join(dir, fmt.Sprintf("vm%d.sock", i+1))
		if err := clones[i].Listen(k.Virtio[3], s); err != nil {
			t.Fatal(err)
		}
		defer clones[i].Close()
		socks = append(socks, s)
		go func() { runs <- k.Run(ctx) }()
	}
	rngs := map[string]int{field(before, "rng"): 0}
	for i, s := range socks {
		pre, err := ask(s, "get", time.Minute)
		if err != nil {
			t.Fatalf("clone %d before hygiene: %v", i+1, err)
		}
		t.Logf("clone %d before hygiene: %s", i+1, pre)
		ent := make([]byte, 64)
		rand.Read(ent)
		hsent := time.Now()
		if ans, err := ask(s, fmt.Sprintf("hygiene %x %d %d", ent, hsent.UnixNano(), i+1), time.Minute); err != nil || ans != "ok" {
			t.Fatalf("clone %d hygiene: %q %v", i+1, ans, err)
		}
		// The clock is set to the host's time when the request left; it
		// arrives up to the request's round trip later (seconds under
		// the nested harness's emulation, microseconds on hardware).
		hrtt := time.Since(hsent)
		sent := time.Now()
		ans, err := ask(s, "get", time.Minute)
		rtt := time.Since(sent)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("clone %d after hygiene: %s (round trip %v)", i+1, ans, rtt)
		if field(ans, "state") != field(before, "state") {
			t.Errorf("clone %d lost the state made before the fork: %s", i+1, ans)
		}
		if field(ans, "gen") != strconv.Itoa(i+1) {
			t.Errorf("clone %d answered with generation %q: not its own machine", i+1, field(ans, "gen"))
		}
		r := field(ans, "rng")
		if j, dup := rngs[r]; dup || len(r) != 32 {
			t.Errorf("clone %d RNG output %q equals that of vm %d", i+1, r, j)
		}
		rngs[r] = i + 1
		// The listener started before the fork serves in the clone, and
		// the agent answers through the clone's own socket.
		kc := agent(s)
		if !hasListener(kc) {
			t.Errorf("clone %d: port 8080 not listed", i+1)
		}
		if out := execOut(t, ctx, kc, "/bin/busybox", "sh", "-c", "/bin/busybox sleep 5 | /bin/busybox nc 127.0.0.1 8080; /bin/busybox cat "+guestagent.GenerationFile); out != "served\n"+strconv.Itoa(i+1)+"\n" {
			t.Errorf("clone %d: listener and generation through exec: %q", i+1, out)
		}
		kc.Close()
		ns, _ := strconv.ParseInt(field(ans, "time"), 10, 64)
		skew := time.Unix(0, ns).Sub(sent.Add(rtt / 2))
		if skew < -time.Second-rtt/2-hrtt || skew > time.Second+rtt/2 {
			t.Errorf("clone %d wall clock off the host's by %v (hygiene round trip %v)", i+1, skew, hrtt)
		}
	}
	// The parent still serves, with its own state.
	if ans, err := ask(sock0, "get", time.Minute); err != nil || field(ans, "state") != field(before, "state") {
		t.Errorf("parent after the fork: %q %v", ans, err)
	}
	for _, s := range append([]string{sock0}, socks...) {
		ask(s, "exit", 30*time.Second)
	}
	for range 4 {
		select {
		case err := <-runs:
			if err != nil {
				t.Errorf("a machine's Run: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("machines did not power off")
		}
	}
}

// guestAgentPort is where the guest agent listens in these tests.
const guestAgentPort = 1024

// dialAgent connects to the guest agent through a VM's vsock socket.
func dialAgent(ctx context.Context, sock string) (*client.Client, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "CONNECT %d\n", guestAgentPort)
	// Read the answer a byte at a time: the agent's hello follows it.
	var line []byte
	b := make([]byte, 1)
	for len(line) < 64 {
		if _, err := c.Read(b); err != nil {
			c.Close()
			return nil, err
		}
		if b[0] == '\n' {
			break
		}
		line = append(line, b[0])
	}
	if !strings.HasPrefix(string(line), "OK ") {
		c.Close()
		return nil, fmt.Errorf("vsock handshake answered %q", line)
	}
	c.SetDeadline(time.Time{})
	return client.New(c)
}

// execOut runs argv through the agent and returns its stdout.
func execOut(t *testing.T, ctx context.Context, c *client.Client, argv ...string) string {
	t.Helper()
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: argv, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout)
	if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 {
		t.Fatalf("exec %q: exit %+v, %v", argv, ex, err)
	}
	return string(out)
}
