package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"tine/netpolicy"
)

// world is a test's network: an upstream namespace with servers on its
// loopback (HTTP :80, HTTPS :443 for any name, an echo on :7000, a DNS
// listener on :53 that counts what reaches it), a sandbox namespace
// attached with a Link, and the gateway between them. Every name maps to
// the upstream's 127.0.0.1.
type world struct {
	t        *testing.T
	up, sb   *testNS
	link     *Link
	gw       *Gateway
	ca       *CA
	dnsSeen  atomic.Int64
	upstream *CA // the upstream servers' CA (the "public" PKI of the test)
}

func policy(t *testing.T, entries ...string) *netpolicy.Policy {
	t.Helper()
	p, err := netpolicy.Parse("allow", entries)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newWorld(t *testing.T, p *netpolicy.Policy) *world {
	t.Helper()
	w := &world{t: t, up: newNS(t), sb: newNS(t)}
	var err error
	if w.upstream, err = NewCA("upstream"); err != nil {
		t.Fatal(err)
	}
	if w.ca, err = NewCA("test"); err != nil {
		t.Fatal(err)
	}
	hello := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "hello %s auth=%q", r.Host, r.Header.Get("Authorization"))
	})
	go http.Serve(w.up.listen(t, "tcp4", "127.0.0.1:80"), hello)
	tl := tls.NewListener(w.up.listen(t, "tcp4", "127.0.0.1:443"), &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return w.upstream.Leaf(h.ServerName)
	}})
	go http.Serve(tl, hello)
	echo := w.up.listen(t, "tcp4", "127.0.0.1:7000")
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	dns := w.up.listenPacket(t, "udp4", "127.0.0.1:53")
	go func() {
		b := make([]byte, 1500)
		for {
			if _, _, err := dns.ReadFrom(b); err != nil {
				return
			}
			w.dnsSeen.Add(1)
		}
	}()
	ctx := context.Background()
	if w.link, err = Attach(ctx, w.sb.pid, p, Ports{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.link.Close() })
	w.gw, err = Start(Config{Sandbox: "test", Addr: w.link.Gateway, Device: w.link.HostName, Peer: w.link.Addr, Policy: p, CA: w.ca, RootCAs: w.upstream.Pool(),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			return w.up.dial(ctx, network, "127.0.0.1:"+port)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.gw.Close() })
	return w
}

// resolver resolves through the gateway, from the sandbox.
func (w *world) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return w.sb.dial(ctx, network, netip.AddrPortFrom(w.link.Gateway, 53).String())
	}}
}

// client is an HTTP client in the sandbox: names resolve through the
// gateway's resolver, and it trusts the sandbox's CA only.
func (w *world) client() *http.Client {
	r := w.resolver()
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			ips, err := r.LookupHost(ctx, host)
			if err != nil {
				return nil, err
			}
			return w.sb.dial(ctx, "tcp4", net.JoinHostPort(ips[0], port))
		},
		TLSClientConfig: &tls.Config{RootCAs: w.ca.Pool()},
	}}
}

func (w *world) get(url string) (int, string, error) {
	resp, err := w.client().Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// denied reads the sandbox filter's counter of refused packets.
func (w *world) denied() int {
	out, err := w.sb.sh("nft list counter inet tine denied")
	if err != nil {
		w.t.Fatalf("read counter: %v: %s", err, out)
	}
	m := regexp.MustCompile(`packets (\d+)`).FindStringSubmatch(out)
	if m == nil {
		w.t.Fatalf("no counter in %s", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestEgress(t *testing.T) {
	w := newWorld(t, policy(t, "allowed.test", "*.wild.test:443"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("AllowedNameWorks", func(t *testing.T) {
		ips, err := w.resolver().LookupHost(ctx, "allowed.test")
		if err != nil || len(ips) != 1 || ips[0] != w.link.Gateway.String() {
			t.Fatalf("allowed.test resolved to %v, %v; want only the gateway %s", ips, err, w.link.Gateway)
		}
		for _, u := range []string{"http://allowed.test/", "https://allowed.test/", "https://a.wild.test/"} {
			code, body, err := w.get(u)
			if err != nil || code != 200 || !strings.HasPrefix(body, "hello "+strings.Split(u, "/")[2]) {
				t.Errorf("GET %s: %d %q %v", u, code, body, err)
			}
		}
	})
	t.Run("ForbiddenNameFailsToResolve", func(t *testing.T) {
		for _, n := range []string{"forbidden.test", "wild.test", "allowed.test.evil.test", "localhost.test"} {
			_, err := w.resolver().LookupHost(ctx, n)
			var de *net.DNSError
			if !errors.As(err, &de) || !de.IsNotFound {
				t.Errorf("lookup %s: %v, want not found", n, err)
			}
		}
	})
	t.Run("RawIPFails", func(t *testing.T) {
		before := w.denied()
		for _, a := range []string{"192.0.2.1:80", "8.8.8.8:443", netip.AddrPortFrom(w.link.Gateway, 22).String(), netip.AddrPortFrom(w.link.Gateway, 7000).String()} {
			c, err := w.sb.dial(ctx, "tcp4", a)
			if err == nil {
				c.Close()
				t.Errorf("connected to %s", a)
			} else if !errors.Is(err, unix_ECONNREFUSED) {
				t.Errorf("dial %s: %v, want refused by the filter", a, err)
			}
		}
		if after := w.denied(); after < before+4 {
			t.Errorf("filter counted %d refused packets, want at least 4", after-before)
		}
		// An address through the gateway, as Host or CONNECT target.
		req := "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
		if st := w.raw(80, req); !strings.Contains(st, " 403 ") {
			t.Errorf("Host 127.0.0.1 through the gateway: %q", st)
		}
		if st := w.raw(3128, "CONNECT 127.0.0.1:7000 HTTP/1.1\r\nHost: 127.0.0.1:7000\r\n\r\n"); !strings.Contains(st, " 403 ") {
			t.Errorf("CONNECT 127.0.0.1:7000: %q", st)
		}
	})
	t.Run("ConnectToForbiddenHostFails", func(t *testing.T) {
		for _, target := range []string{"forbidden.test:443", "forbidden.test:7000", "b.wild.test:7000"} {
			if st := w.raw(3128, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"); !strings.Contains(st, " 403 ") {
				t.Errorf("CONNECT %s: %q", target, st)
			}
		}
		// A relayed CONNECT: allowed first hop, forbidden second.
		c := w.connect("allowed.test:80")
		fmt.Fprintf(c, "CONNECT forbidden.test:443 HTTP/1.1\r\nHost: forbidden.test:443\r\n\r\n")
		if st := status(c); !strings.Contains(st, " 403 ") && !strings.Contains(st, " 421 ") {
			t.Errorf("relayed CONNECT: %q", st)
		}
		c.Close()
		// Allowed CONNECT, then an SNI for another name.
		c = w.connect("allowed.test:443")
		tc := tls.Client(c, &tls.Config{ServerName: "forbidden.test", RootCAs: w.ca.Pool()})
		if err := tc.HandshakeContext(ctx); err == nil {
			t.Error("TLS to forbidden.test inside CONNECT allowed.test:443 succeeded")
		}
		c.Close()
		// Allowed CONNECT to a raw port works.
		c = w.connect("allowed.test:7000")
		fmt.Fprintf(c, "ping\n")
		if l, err := bufio.NewReader(c).ReadString('\n'); l != "ping\n" {
			t.Errorf("echo through CONNECT: %q %v", l, err)
		}
		c.Close()
	})
	t.Run("SNIMustMatchHost", func(t *testing.T) {
		c, err := w.sb.dial(ctx, "tcp4", netip.AddrPortFrom(w.link.Gateway, 443).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tc := tls.Client(c, &tls.Config{ServerName: "allowed.test", RootCAs: w.ca.Pool()})
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: forbidden.test\r\n\r\n")
		if st := status(tc); !strings.Contains(st, " 421 ") {
			t.Errorf("Host forbidden.test over SNI allowed.test: %q", st)
		}
		c2, err := w.sb.dial(ctx, "tcp4", netip.AddrPortFrom(w.link.Gateway, 443).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		tc2 := tls.Client(c2, &tls.Config{ServerName: "forbidden.test", RootCAs: w.ca.Pool()})
		if err := tc2.HandshakeContext(ctx); err == nil {
			t.Error("TLS handshake with SNI forbidden.test succeeded")
		}
		c3, _ := w.sb.dial(ctx, "tcp4", netip.AddrPortFrom(w.link.Gateway, 443).String())
		tc3 := tls.Client(c3, &tls.Config{InsecureSkipVerify: true})
		if err := tc3.HandshakeContext(ctx); err == nil {
			t.Error("TLS handshake without SNI succeeded")
		}
		c3.Close()
	})
	t.Run("DNSTunnelFails", func(t *testing.T) {
		before := w.denied()
		seen := w.dnsSeen.Load()
		r := w.resolver()
		for _, n := range []string{"6578666696c74726174696f6e.forbidden.test", "6578666696c74726174696f6e.allowed.test"} {
			if txt, err := r.LookupTXT(ctx, n); err == nil && len(txt) > 0 {
				t.Errorf("TXT %s answered %q", n, txt)
			}
		}
		if _, err := r.LookupHost(ctx, "6578666696c7472.forbidden.test"); err == nil {
			t.Error("a tunnel name resolved")
		}
		// Straight to an outside resolver (the upstream's, by address), UDP and TCP.
		other := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return w.sb.dial(ctx, network, "192.0.2.53:53")
		}}
		ctx2, cancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := other.LookupHost(ctx2, "x.forbidden.test"); err == nil {
			t.Error("a lookup through another resolver succeeded")
		}
		cancel()
		if got := w.dnsSeen.Load() - seen; got != 0 {
			t.Errorf("%d DNS queries reached the upstream's resolver", got)
		}
		if w.denied() <= before {
			t.Error("the filter counted no refused DNS packet")
		}
	})
	t.Run("IPv6Fails", func(t *testing.T) {
		out, err := w.sb.sh("cat /proc/sys/net/ipv6/conf/all/disable_ipv6")
		if err != nil || strings.TrimSpace(out) != "1" {
			t.Errorf("IPv6 in the sandbox namespace: disable_ipv6=%q %v", out, err)
		}
		for _, a := range []string{"[2001:db8::1]:80", "[64:ff9b::c000:201]:80"} {
			if c, err := w.sb.dial(ctx, "tcp6", a); err == nil {
				c.Close()
				t.Errorf("connected to %s", a)
			}
		}
		ips, err := w.resolver().LookupIPAddr(ctx, "allowed.test")
		for _, ip := range ips {
			if ip.IP.To4() == nil {
				t.Errorf("allowed.test has an IPv6 answer %v", ip)
			}
		}
		_ = err
		if st := w.raw(80, "GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n"); !strings.Contains(st, " 400 ") {
			t.Errorf("Host [::1]: %q", st)
		}
		if !strings.Contains(Ruleset(policy(t, "a.test"), w.link.Gateway, DefaultPorts), "meta nfproto ipv6 counter name denied reject") {
			t.Error("ruleset does not refuse IPv6")
		}
	})
	t.Run("PolicyChangeCutsOpenConnections", func(t *testing.T) {
		tunnel := w.connect("allowed.test:7000")
		defer tunnel.Close()
		fmt.Fprintf(tunnel, "one\n")
		br := bufio.NewReader(tunnel)
		if l, _ := br.ReadString('\n'); l != "one\n" {
			t.Fatalf("echo: %q", l)
		}
		c, err := w.sb.dial(ctx, "tcp4", netip.AddrPortFrom(w.link.Gateway, 443).String())
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: "allowed.test", RootCAs: w.ca.Pool()})
		defer tc.Close()
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		tr := bufio.NewReader(tc)
		if resp, err := http.ReadResponse(tr, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("keep-alive HTTPS: %v %v", resp, err)
		} else {
			io.Copy(io.Discard, resp.Body)
		}
		keep := w.connect("b.wild.test:443") // still allowed after the change
		defer keep.Close()
		// Earlier subtests' idle keep-alive connections to allowed.test
		// are cut too.
		if n := w.gw.SetPolicy(policy(t, "*.wild.test:443")); n < 2 {
			t.Errorf("SetPolicy cut %d connections, want at least 2", n)
		}
		tunnel.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := br.ReadString('\n'); err == nil || isTimeout(err) {
			t.Errorf("tunnel read after the change: %v, want closed", err)
		}
		tc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := tr.ReadByte(); err == nil || isTimeout(err) {
			t.Errorf("HTTPS read after the change: %v, want closed", err)
		}
		if _, err := w.resolver().LookupHost(ctx, "allowed.test"); err == nil {
			t.Error("allowed.test still resolves after the change")
		}
		ktc := tls.Client(keep, &tls.Config{ServerName: "b.wild.test", RootCAs: w.ca.Pool()})
		fmt.Fprintf(ktc, "GET / HTTP/1.1\r\nHost: b.wild.test\r\n\r\n")
		if st := status(ktc); !strings.Contains(st, " 200 ") {
			t.Errorf("a connection still allowed after the change: %q", st)
		}
		if code, _, err := w.get("https://c.wild.test/"); code != 200 {
			t.Errorf("still-allowed name after the change: %d %v", code, err)
		}
	})
}

var unix_ECONNREFUSED = errConnRefused

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// raw sends req to the gateway's port from the sandbox and returns the
// status line.
func (w *world) raw(port uint16, req string) string {
	w.t.Helper()
	c, err := w.sb.dial(context.Background(), "tcp4", netip.AddrPortFrom(w.link.Gateway, port).String())
	if err != nil {
		w.t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, req)
	return status(c)
}

func status(c net.Conn) string {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	l, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "error: " + err.Error()
	}
	return l
}

// connect opens a CONNECT tunnel from the sandbox through the gateway.
func (w *world) connect(target string) net.Conn {
	w.t.Helper()
	c, err := w.sb.dial(context.Background(), "tcp4", netip.AddrPortFrom(w.link.Gateway, 3128).String())
	if err != nil {
		w.t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	// Read the status byte by byte: what follows belongs to the tunnel.
	var line []byte
	b := make([]byte, 1)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for !strings.HasSuffix(string(line), "\r\n\r\n") {
		if _, err := c.Read(b); err != nil {
			w.t.Fatalf("CONNECT %s: %v after %q", target, err, line)
		}
		line = append(line, b[0])
	}
	c.SetReadDeadline(time.Time{})
	if !strings.Contains(string(line), " 200 ") {
		w.t.Fatalf("CONNECT %s: %q", target, line)
	}
	return c
}
