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
	"tine/vmm/disk"
	"tine/vmm/virtio"
)

// guestServer is the guest side of TestVirtioGuestFork: a vsock server
// started before the fork, holding state made before it, that answers
// "get" (its state, 16 bytes of the kernel RNG, the wall clock, the
// generation), "hygiene HEX NANOS GEN" (guestagent.ApplyHygiene) and
// "exit".
func guestServer(t *testing.T, l net.Listener) {
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
		if ans, err := ask(s, fmt.Sprintf("hygiene %x %d %d", ent, time.Now().UnixNano(), i+1), time.Minute); err != nil || ans != "ok" {
			t.Fatalf("clone %d hygiene: %q %v", i+1, ans, err)
		}
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
		ns, _ := strconv.ParseInt(field(ans, "time"), 10, 64)
		skew := time.Unix(0, ns).Sub(sent.Add(rtt / 2))
		if skew < -time.Second-rtt/2 || skew > time.Second+rtt/2 {
			t.Errorf("clone %d wall clock off the host's by %v", i+1, skew)
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
