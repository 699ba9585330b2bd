package sandbox_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/gateway"
	"tine/netpolicy"
	"tine/sandbox"
)

// upstreamNS is a network namespace made by the test, with servers on its
// loopback standing for the internet; the gateway dials into it, every
// name mapping to its 127.0.0.1.
type upstreamNS struct{ pid int }

func newUpstream(t *testing.T, h http.Handler) (*upstreamNS, *gateway.CA) {
	cmd := exec.Command("unshare", "--net", "sh", "-c", "ip link set lo up && echo ready && exec sleep 3600")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := out.Read(make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	u := &upstreamNS{cmd.Process.Pid}
	ca, err := gateway.NewCA("upstream")
	if err != nil {
		t.Fatal(err)
	}
	var hello http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s auth=%s\n", r.Host, r.Header.Get("Authorization"))
	})
	if h != nil {
		hello = h
	}
	for _, port := range []string{"80", "443"} {
		var l net.Listener
		if err := u.do(func() (err error) { l, err = net.Listen("tcp4", "127.0.0.1:"+port); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		if port == "443" {
			l = tls.NewListener(l, &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) }})
		}
		go http.Serve(l, hello)
	}
	return u, ca
}

func (u *upstreamNS) do(fn func() error) error {
	runtime.LockOSThread()
	self, _ := os.Open("/proc/thread-self/ns/net")
	defer self.Close()
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", u.pid))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return err
	}
	runtime.UnlockOSThread()
	return ferr
}

func (u *upstreamNS) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	_, port, _ := net.SplitHostPort(addr)
	var c net.Conn
	err := u.do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, "127.0.0.1:"+port)
		return err
	})
	return c, err
}

func allowPolicy(t *testing.T, entries ...string) *netpolicy.Policy {
	p, err := netpolicy.Parse("allow", entries)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNetworkPolicy runs curl in a real sandbox whose policy allows one
// name: that name works over HTTP and HTTPS (the sandbox trusts its CA),
// without any proxy variable; others do not resolve; raw addresses and
// IPv6 fail; a fork inherits the policy; a change applies to the running
// sandbox.
func TestNetworkPolicy(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is needed (make deps)")
	}
	up, upCA := newUpstream(t, nil)
	e := newEnvWith(t, sandbox.Options{Network: sandbox.NetworkOptions{Dial: up.dial, RootCAs: upCA.Pool()}})
	ctx := context.Background()
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "net", Dir: e.project, Network: allowPolicy(t, "allowed.test")}); err != nil {
		t.Fatal(err)
	}
	check := func(name string) {
		t.Helper()
		out := e.mustSh(name, "env | grep -i _proxy || true; curl -sS --max-time 10 http://allowed.test/ && curl -sS --max-time 10 https://allowed.test/")
		if strings.Count(out, "hello allowed.test") != 2 || strings.Contains(strings.ToLower(out), "_proxy=") {
			t.Errorf("%s: allowed name: %q", name, out)
		}
		for _, c := range []struct{ script, want string }{
			{"curl -sS --max-time 5 http://forbidden.test/", "Could not resolve host"},
			{"curl -sS --max-time 5 http://192.0.2.1/", "Failed to connect"},
			{"curl -sS --max-time 5 -H 'Host: forbidden.test' http://allowed.test/", "not allowed"},
			{"curl -sS --max-time 5 -6 http://allowed.test/", "ould"},
			{"curl -sS --max-time 5 'http://[2001:db8::1]/'", "Failed to connect"},
			{"curl -sS --max-time 5 -x http://allowed.test:3128 https://forbidden.test/", "403"},
		} {
			out, code := e.sh(name, c.script)
			if code == 0 && !strings.Contains(out, c.want) || !strings.Contains(out, c.want) {
				t.Errorf("%s: %s: exit %d %q, want %q", name, c.script, code, out, c.want)
			}
		}
	}
	check("net")
	if b, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt"); strings.Contains(string(b), "tine sandbox") {
		t.Error("the host's trust store holds a sandbox CA")
	}
	forks, err := e.m.Fork(ctx, "net", sandbox.ForkOptions{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	check(forks[0].Name)
	if err := e.m.SetNetwork(ctx, "net", allowPolicy(t, "other.test")); err != nil {
		t.Fatal(err)
	}
	if out, code := e.sh("net", "curl -sS --max-time 5 http://allowed.test/"); code == 0 {
		t.Errorf("allowed.test after the change: %q", out)
	}
	if out := e.mustSh("net", "curl -sS --max-time 5 http://other.test/"); !strings.Contains(out, "hello other.test") {
		t.Errorf("other.test after the change: %q", out)
	}
	if out := e.mustSh(forks[0].Name, "curl -sS --max-time 5 http://allowed.test/"); !strings.Contains(out, "hello allowed.test") {
		t.Errorf("the fork's policy changed with its parent's: %q", out)
	}
	none, _ := netpolicy.Parse("none", nil)
	if err := e.m.SetNetwork(ctx, "net", none); err != nil {
		t.Fatal(err)
	}
	if out, code := e.sh("net", "curl -sS --max-time 5 http://other.test/; ip -o link 2>/dev/null | grep -c eth0"); code == 0 && !strings.HasSuffix(strings.TrimSpace(out), "0") {
		t.Errorf("mode none: %q", out)
	}
	_ = time.Second
}
