package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"tine/netpolicy"
)

// TestDialRefusesSandboxRange: whatever the policy allows, neither the
// default dialer nor a given one (wrapped) dials into the sandboxes'
// range, and the policy check refuses those addresses first.
func TestDialRefusesSandboxRange(t *testing.T) {
	p := policy(t, Subnet.String(), "10.0.0.0/8", "0.0.0.0/0")
	g := &Gateway{policy: p}
	ctx := context.Background()
	for _, addr := range []string{"10.213.0.1:80", "10.213.255.254:3128", "10.213.7.2:7380"} {
		if c, err := g.guardedDial(ctx, "tcp4", addr); err == nil || !strings.Contains(err.Error(), "sandboxes' range") {
			if c != nil {
				c.Close()
			}
			t.Errorf("default dialer, %s: %v", addr, err)
		}
		called := false
		dial := refuseSandboxes(func(context.Context, string, string) (net.Conn, error) {
			called = true
			return nil, errors.New("dialed")
		})
		if _, err := dial(ctx, "tcp", addr); called || err == nil || !strings.Contains(err.Error(), "sandboxes' range") {
			t.Errorf("given dialer, %s: called %v, %v", addr, called, err)
		}
		host, port, _ := net.SplitHostPort(addr)
		var n uint16
		fmt.Sscan(port, &n)
		if allowed(p, host, n) {
			t.Errorf("the policy check allows %s", addr)
		}
	}
	called := false
	dial := refuseSandboxes(func(context.Context, string, string) (net.Conn, error) {
		called = true
		return nil, errors.New("dialed")
	})
	for _, addr := range []string{"10.1.2.3:80", "api.test:443"} {
		called = false
		if dial(ctx, "tcp", addr); !called {
			t.Errorf("given dialer, %s: not called", addr)
		}
	}
	if !allowed(p, "10.1.2.3", 80) || !allowed(p, "10.212.255.255", 80) {
		t.Error("the policy check refuses addresses outside the sandboxes' range")
	}
}

// TestRulesRefuseSandboxRange: the sandbox's filter refuses the
// sandboxes' range (but its own gateway) before any rule of its list, in
// both modes; the host's table drops what comes in on a sandbox's veth
// for another address than that veth's, and forwards nothing between
// sandboxes. nft checks both rulesets.
func TestRulesRefuseSandboxRange(t *testing.T) {
	gw := netip.MustParseAddr("10.213.4.1")
	open, _ := netpolicy.Parse("open", nil)
	for _, p := range []*netpolicy.Policy{policy(t, Subnet.String(), "10.0.0.0/8:80"), open} {
		rs := Ruleset(p, gw, DefaultPorts)
		for _, c := range []struct{ before, after string }{
			{"ip daddr 10.213.4.1 tcp dport { 53, 80, 443, 3128, 7380 } accept", "ip daddr 10.213.0.0/16 meta l4proto tcp counter name denied reject"},
			{"ip daddr 10.213.0.0/16 meta l4proto tcp counter name denied reject", "ip daddr 10.213.0.0/16 counter name denied reject with icmpx"},
			{"ip daddr 10.213.0.0/16 counter name denied reject with icmpx", "ip daddr 10.213.0.0/16 accept"},
			{"ip daddr 10.213.0.0/16 counter name denied reject with icmpx", "    accept\n"},
			{"ip saddr 10.213.4.1 accept", "ip saddr 10.213.0.0/16 drop"},
			{"ip saddr 10.213.0.0/16 drop", "ip saddr 10.213.0.0/16 accept"},
		} {
			// (An "after" may be absent: the list's rule in mode open.)
			i, j := strings.Index(rs, c.before), strings.Index(rs, c.after)
			if i < 0 || j >= 0 && j < i {
				t.Errorf("mode %s: %q not before %q in\n%s", p.GetMode(), c.before, c.after, rs)
			}
		}
		if p.GetMode() == netpolicy.Allow && !strings.Contains(rs, "ip daddr 10.213.0.0/16 accept") {
			t.Errorf("the list's rule is missing:\n%s", rs)
		}
		nftCheck(t, rs)
	}
	hs := hostRuleset(DefaultPorts)
	for _, want := range []string{
		`iifname "tn*" fib daddr . iif type != local counter drop`,
		`iifname "tn*" oifname "tn*" drop`,
		"ip saddr 10.213.0.0/16 ip daddr 10.213.0.0/16 drop",
		"tcp dport { 53, 80, 443, 3128, 7380 } accept",
	} {
		if !strings.Contains(hs, want) {
			t.Errorf("host table lacks %q:\n%s", want, hs)
		}
	}
	if strings.Index(hs, "fib daddr") > strings.Index(hs, "udp dport") {
		t.Errorf("the host table accepts the gateway's ports before it checks the address:\n%s", hs)
	}
	nftCheck(t, hs)
}

// nftCheck has nft parse and check a ruleset without applying it.
func nftCheck(t *testing.T, rs string) {
	t.Helper()
	cmd := exec.Command("nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(rs)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("nft -c: %v: %s\n%s", err, out, rs)
	}
}

// TestListenersServeOnlyTheirSandbox: a gateway's sockets, bound to their
// sandbox's veth, answer nothing that comes another way (from the host
// itself, or from a second sandbox allowed the whole range), and close a
// connection from their sandbox's veth with another source address.
func TestListenersServeOnlyTheirSandbox(t *testing.T) {
	w := newWorld(t, policy(t, "allowed.test"))
	ctx := context.Background()
	apiLn, err := w.link.Listen(ctx, DefaultPorts.API)
	if err != nil {
		t.Fatal(err)
	}
	defer apiLn.Close()
	go func() {
		for {
			c, err := apiLn.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "api\n")
			c.Close()
		}
	}()
	// The sandbox itself is served.
	if got := readFrom(t, w.sb, netip.Addr{}, netip.AddrPortFrom(w.link.Gateway, DefaultPorts.API)); got != "api\n" {
		t.Fatalf("the sandbox's own API listener: %q", got)
	}
	ports := []uint16{DefaultPorts.DNS, DefaultPorts.HTTP, DefaultPorts.HTTPS, DefaultPorts.Proxy, DefaultPorts.API}

	// Every socket is bound to the sandbox's veth.
	for _, ln := range append(w.gw.lns, apiLn) {
		if dev := boundTo(t, ln); dev != w.link.HostName {
			t.Errorf("listener %s is bound to %q, not %s", ln.Addr(), dev, w.link.HostName)
		}
	}
	if dev := boundTo(t, w.gw.udp); dev != w.link.HostName {
		t.Errorf("the resolver's socket is bound to %q, not %s", dev, w.link.HostName)
	}
	// From the host itself (its connections come from the gateway's own
	// address): closed at once.
	for _, port := range ports {
		if got := readFrom(t, nil, netip.Addr{}, netip.AddrPortFrom(w.link.Gateway, port)); got != "" {
			t.Errorf("the host got %q from the gateway's port %d", got, port)
		}
	}

	// From a second sandbox allowed the whole range.
	other := newNS(t)
	ol, err := Attach(ctx, other.pid, policy(t, Subnet.String()), Ports{})
	if err != nil {
		t.Fatal(err)
	}
	defer ol.Close()
	for _, port := range ports {
		if got := readFrom(t, other, netip.Addr{}, netip.AddrPortFrom(w.link.Gateway, port)); got != "" {
			t.Errorf("a second sandbox got %q from the first's port %d", got, port)
		}
	}

	// From the sandbox's own veth with an address not its own: the
	// connection is made and closed at once.
	spoof := netip.MustParseAddr("192.0.2.7")
	if out, err := w.sb.sh("ip addr add " + spoof.String() + "/32 dev eth0"); err != nil {
		t.Fatal(err, out)
	}
	if out, err := exec.Command("ip", "route", "add", spoof.String()+"/32", "dev", w.link.HostName).CombinedOutput(); err != nil {
		t.Fatal(err, string(out))
	}
	for _, port := range []uint16{DefaultPorts.HTTP, DefaultPorts.Proxy, DefaultPorts.API} {
		if got := readFrom(t, w.sb, spoof, netip.AddrPortFrom(w.link.Gateway, port)); got != "" {
			t.Errorf("another source address on the sandbox's veth got %q from port %d", got, port)
		}
	}
	// DNS over UDP from that address gets no answer either.
	var answered bool
	w.sb.do(func() error {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(spoof, 0)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(w.link.Gateway, 53)))
		if err != nil {
			return err
		}
		defer c.Close()
		c.Write(query(t, "allowed.test.", dnsmessage.TypeA))
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _ := c.Read(make([]byte, 512))
		answered = n > 0
		return nil
	})
	if answered {
		t.Error("the resolver answered another source address on the sandbox's veth")
	}
}

// boundTo returns the device a socket is bound to.
func boundTo(t *testing.T, s any) string {
	t.Helper()
	if pl, ok := s.(*peerListener); ok {
		s = pl.Listener
	}
	sc, ok := s.(syscall.Conn)
	if !ok {
		t.Fatalf("%T has no file descriptor", s)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var dev string
	var gerr error
	rc.Control(func(fd uintptr) { dev, gerr = unix.GetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE) })
	if gerr != nil {
		t.Fatal(gerr)
	}
	return dev
}

// readFrom connects from namespace ns (nil: the host) (from address src when valid) to
// dst, sends a request, and returns what comes back within two seconds
// ("" when the connection fails or is closed).
func readFrom(t *testing.T, ns *testNS, src netip.Addr, dst netip.AddrPort) string {
	t.Helper()
	var c net.Conn
	dial := func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second}
		if src.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
		}
		c, err = d.Dial("tcp4", dst.String())
		return err
	}
	var err error
	if ns == nil {
		err = dial()
	} else {
		err = ns.do(dial)
	}
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	io.WriteString(c, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	var b bytes.Buffer
	io.Copy(&b, c)
	return b.String()
}
