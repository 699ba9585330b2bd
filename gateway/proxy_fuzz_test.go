package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"

	"tine/internal/syncbuf"
	"tine/netpolicy"
)

// The fuzz targets' policy and secrets. fuzzAllowed and fuzzBinds write
// them out by hand, so that the gateway's own matching is checked
// against them rather than against itself.
var fuzzPolicy = []string{"api.example.com:443", "*.svc.example.com:80", "192.0.2.10:7000"}

func fuzzSecrets() []Secret {
	return []Secret{
		{Name: "API", Host: "api.example.com", Header: "Authorization", Prefix: "Bearer", Value: "v4lue-API-7c1e0b", Placeholder: "tine-secret-placeholder-API"},
		{Name: "SVC", Host: "*.Svc.Example.com", Header: "X-Svc-Key", Value: "v4lue-SVC-93ad2f", Placeholder: "tine-secret-placeholder-SVC", Plain: true},
		{Name: "OTHER", Host: "other.example.com", Header: "X-Other-Key", Value: "v4lue-OTHER-51b0c4", Placeholder: "tine-secret-placeholder-OTHER", Plain: true},
	}
}

// fuzzAllowed says whether fuzzPolicy lets the sandbox reach host:port,
// host being what is dialed.
func fuzzAllowed(host string, port uint16) bool {
	switch host {
	case "api.example.com":
		return port == 443
	case "192.0.2.10":
		return port == 7000
	}
	sub, ok := strings.CutSuffix(host, ".svc.example.com")
	if !ok || sub == "" || port != 80 {
		return false
	}
	n, err := netpolicy.NormalizeName(host)
	return err == nil && n == host
}

// fuzzBinds says whether the secret named name goes on a request dialed
// to host, over TLS or not.
func fuzzBinds(name, host string, https bool) bool {
	switch name {
	case "API":
		return host == "api.example.com" && https
	case "SVC":
		sub, ok := strings.CutSuffix(host, ".svc.example.com")
		return ok && sub != ""
	}
	return false
}

// fuzzTarget splits an authority (Host header, URL host or CONNECT
// target) the way net/url does, lower-cased and without a trailing dot:
// the destination a server receiving that Host would take it for.
func fuzzTarget(authority string, def uint16) (string, uint16, bool) {
	u := &url.URL{Host: authority}
	port := def
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return "", 0, false
		}
		port = uint16(n)
	}
	return strings.TrimSuffix(strings.ToLower(u.Hostname()), "."), port, true
}

func splitAddr(addr string) (string, uint16) {
	h, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.ParseUint(p, 10, 16)
	return h, uint16(n)
}

// fuzzConn is the sandbox's end of a connection: it reads from in and
// keeps what is written to it.
type fuzzConn struct {
	in  io.Reader
	out syncbuf.Buffer
}

func (c *fuzzConn) Read(b []byte) (int, error) {
	if c.in == nil {
		return 0, io.EOF
	}
	return c.in.Read(b)
}

func (c *fuzzConn) Write(b []byte) (int, error) { return c.out.Write(b) }

var fuzzAddr = &net.TCPAddr{IP: net.IPv4(10, 213, 0, 2), Port: 40000}

func (c *fuzzConn) Close() error                     { return nil }
func (c *fuzzConn) LocalAddr() net.Addr              { return fuzzAddr }
func (c *fuzzConn) RemoteAddr() net.Addr             { return fuzzAddr }
func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// fuzzWriter is a ResponseWriter that hands over the connection the way
// http.Server does: the connection and the reader holding what was read
// ahead.
type fuzzWriter struct {
	*httptest.ResponseRecorder
	c        net.Conn
	br       *bufio.Reader
	hijacked bool
}

func (w *fuzzWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.hijacked = true
	return w.c, bufio.NewReadWriter(w.br, bufio.NewWriter(w.c)), nil
}

// fuzzDial is a connection the gateway made upstream.
type fuzzDial struct {
	req  int    // the request of the input that made it
	addr string // what was dialed
	kind string // "http" or "https" (the transport) or "raw" (a CONNECT relay)
}

// fuzzSeen is a request as the upstream server received it.
type fuzzSeen struct {
	fuzzDial
	host   string
	header http.Header
}

// fuzzNet stands for the outside network: it records every dial and
// answers each request on a transport's connection with 204.
type fuzzNet struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	cur   int
	dials []fuzzDial
	seen  []fuzzSeen
}

func (n *fuzzNet) dialer(kind string) func(context.Context, string, string) (net.Conn, error) {
	return func(_ context.Context, _, addr string) (net.Conn, error) {
		n.mu.Lock()
		d := fuzzDial{req: n.cur, addr: addr, kind: kind}
		n.dials = append(n.dials, d)
		n.mu.Unlock()
		if kind == "raw" {
			return &fuzzConn{}, nil
		}
		client, server := net.Pipe()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer server.Close()
			br := bufio.NewReader(server)
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.seen = append(n.seen, fuzzSeen{fuzzDial: d, host: req.Host, header: req.Header.Clone()})
			n.mu.Unlock()
			if _, err := io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20)); err != nil {
				return
			}
			io.WriteString(server, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
		}()
		return client, nil
	}
}

func (n *fuzzNet) dialsOf(req int) []fuzzDial {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ds []fuzzDial
	for _, d := range n.dials {
		if d.req == req {
			ds = append(ds, d)
		}
	}
	return ds
}

// fuzzGateway is a gateway as Start makes it, without listeners: its
// dials go to n, and what CONNECT hands on to the HTTP or TLS server
// waits in a queue of one.
func fuzzGateway(p *netpolicy.Policy, ca *CA, n *fuzzNet) *Gateway {
	g := &Gateway{cfg: Config{Sandbox: "fuzz", CA: ca, Dial: n.dialer("raw")},
		policy: p, secrets: fuzzSecrets(), conns: map[*conn]struct{}{}, denied: map[string]int{}}
	g.transport = &http.Transport{DialContext: n.dialer("http"), DialTLSContext: n.dialer("https"), DisableKeepAlives: true}
	g.httpQ = &queue{ch: make(chan net.Conn, 1), done: make(chan struct{})}
	g.tlsQ = &queue{ch: make(chan net.Conn, 1), done: make(chan struct{})}
	return g
}

// serverAccepts says whether http.Server would hand r to its handler
// (the checks it makes after parsing).
func serverAccepts(r *http.Request) bool {
	if r.ProtoMajor != 1 {
		return false
	}
	if r.URL.Host == "" && !httpguts.ValidHostHeader(r.Host) {
		return false
	}
	for k, vv := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// fuzzHandshake runs the gateway's certificate choice for a ClientHello
// with server name sni on c and checks it against the policy and the
// CONNECT target; it says whether the handshake goes on.
func fuzzHandshake(t *testing.T, g *Gateway, c *conn, sni string) bool {
	if sni == "" || strings.HasSuffix(sni, ".") {
		// crypto/tls refuses a ClientHello with an empty or dotted name
		// before asking for a certificate; the gateway refuses no SNI.
		if sni == "" {
			if _, err := g.certificate(&tls.ClientHelloInfo{Conn: c}); err == nil {
				t.Error("a certificate for a ClientHello without SNI")
			}
		}
		return false
	}
	lower := strings.ToLower(sni)
	port := uint16(443)
	if c.expect != "" {
		port = c.port
	}
	cert, err := g.certificate(&tls.ClientHelloInfo{ServerName: sni, Conn: c})
	want := fuzzAllowed(lower, port) && (c.expect == "" || lower == c.expect)
	if (err == nil) != want {
		t.Fatalf("SNI %q (CONNECT target %q:%d): certificate error %v, want allowed %v", sni, c.expect, c.port, err, want)
	}
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != lower {
		t.Fatalf("SNI %q: leaf for %v (%v)", sni, leaf.DNSNames, err)
	}
	return true
}

// FuzzProxy feeds the gateway's HTTP front end what a sandbox sends on
// one connection: requests (absolute-form, origin-form with Host,
// CONNECT) parsed from data, on the proxy port or, when tlsFirst is set,
// on the HTTPS port after a ClientHello naming sni; a CONNECT to port
// 443 goes on to a ClientHello naming sni, one to port 80 to plain
// requests in the tunnel. Every certificate choice and every dial is
// recorded and checked: SNI, CONNECT targets and dials are only ever
// destinations the policy allows; a dial goes to the host and port that
// the request's Host (or URL or CONNECT authority) names as net/url
// reads it, on a TLS or CONNECT connection only to the connection's own
// name; the Host the upstream receives names the dialed host and port;
// and each secret reaches exactly the requests dialed to its host (over
// HTTPS unless it is Plain), while no other request carries its value or
// its placeholder.
func FuzzProxy(f *testing.F) {
	const (
		get  = "GET / HTTP/1.1\r\nHost: "
		end  = "\r\n\r\n"
		abs  = "GET http://"
		tail = "/ HTTP/1.1\r\nHost: x" + end
	)
	for _, s := range []struct {
		tls       bool
		sni, data string
	}{
		{false, "", abs + "api.example.com:443" + tail},
		{false, "", abs + "a.svc.example.com/x?y HTTP/1.1\r\nHost: a.svc.example.com\r\nX-Svc-Key: tine-secret-placeholder-SVC" + end},
		{false, "", get + "a.svc.example.com" + end + get + "A.SVC.example.com.:80" + end},
		{false, "", "POST / HTTP/1.1\r\nHost: b.svc.example.com\r\nContent-Length: 5" + end + "hello" + get + "b.svc.example.com" + end},
		{false, "", "POST / HTTP/1.1\r\nHost: b.svc.example.com\r\nTransfer-Encoding: chunked" + end + "5\r\nhello\r\n0\r\nAuthorization: x" + end},
		{false, "api.example.com", "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443" + end + get + "api.example.com\r\nAuthorization: tine-secret-placeholder-API" + end + get + "other.example.com" + end},
		{false, "Api.Example.Com", "CONNECT API.example.com.:443 HTTP/1.1" + end + get + "api.example.com:443" + end},
		{false, "other.example.com", "CONNECT api.example.com:443 HTTP/1.1" + end + get + "api.example.com" + end},
		{false, "", "CONNECT b.svc.example.com:80 HTTP/1.1" + end + get + "b.svc.example.com" + end + get + "api.example.com:443" + end + abs + "c.svc.example.com" + tail},
		{false, "", "CONNECT b.svc.example.com:80 HTTP/1.1" + end + "CONNECT api.example.com:443 HTTP/1.1" + end},
		{false, "", "CONNECT 192.0.2.10:7000 HTTP/1.1" + end + "ping"},
		{false, "", "CONNECT api.example.com:7000 HTTP/1.1" + end},
		{false, "", "CONNECT / HTTP/1.1\r\nHost: api.example.com:443" + end},
		{true, "api.example.com", get + "api.example.com\r\nAuthorization: Bearer mine\r\nX-Other-Key: tine-secret-placeholder-OTHER" + end + get + "evil.com" + end},
		{true, "API.Example.COM", get + "API.EXAMPLE.COM.:443" + end},
		{true, "api.example.com", abs + "api.example.com:443" + tail},
		{true, "api.example.com", "GET https://api.example.com/ HTTP/1.1\r\nHost: api.example.com" + end},
		{true, "evil.com", get + "api.example.com" + end},
		{true, "", get + "api.example.com" + end},
		{false, "", abs + "evil.com@api.example.com:443" + tail},
		{false, "", abs + "api.example.com:443@evil.com" + tail},
		{false, "", abs + "api.example.com.evil.com:443" + tail},
		{false, "", abs + "evil.com#api.example.com:443" + tail},
		{false, "", abs + "api%2Eexample.com:443" + tail},
		{false, "", abs + "[api.example.com]:443" + tail},
		{false, "", abs + "[::1]:443" + tail},
		{false, "", abs + "api.example.com:443:443" + tail},
		{false, "", abs + "api.example.com:0443" + tail},
		{false, "", abs + "api.example.com:65979" + tail},
		{false, "", get + "evil.com@api.example.com:443" + end},
		{false, "", get + "evil.com#api.example.com:443" + end},
		{false, "", get + "[api.example.com]:443" + end},
		{false, "", get + "api.example.com:443\r\nHost: evil.com" + end},
		{false, "", "GET //evil.com/ HTTP/1.1\r\nHost: api.example.com:443" + end},
		{false, "", "CONNECT evil.com@api.example.com:443 HTTP/1.1" + end},
		{false, "", "CONNECT api.example.com:443@evil.com:7000 HTTP/1.1" + end},
		{false, "", "CONNECT [192.0.2.10]:7000 HTTP/1.1" + end},
		{false, "", "CONNECT 10.213.0.1:7000 HTTP/1.1" + end},
		{false, "", "GET http://192.0.2.10:7000/ HTTP/1.1" + end},
	} {
		f.Add(s.tls, s.sni, []byte(s.data))
	}
	p, err := netpolicy.Parse("allow", fuzzPolicy)
	if err != nil {
		f.Fatal(err)
	}
	ca, err := NewCA("fuzz")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, tlsFirst bool, sni string, data []byte) {
		n := &fuzzNet{}
		g := fuzzGateway(p, ca, n)
		defer g.transport.CloseIdleConnections()
		sandbox := &fuzzConn{in: bytes.NewReader(data)}
		c := &conn{Conn: sandbox, g: g, local: 3128}
		var state *tls.ConnectionState
		if tlsFirst {
			c.local = 443
			if !fuzzHandshake(t, g, c, sni) {
				return
			}
			state = &tls.ConnectionState{ServerName: sni}
		}
		br := bufio.NewReader(c)
	requests:
		for i := 0; i < 4; i++ {
			req, err := http.ReadRequest(br)
			if err != nil || !serverAccepts(req) {
				break
			}
			req.TLS = state
			req.RemoteAddr = sandbox.RemoteAddr().String()
			req = req.WithContext(context.WithValue(context.Background(), connKey{}, c))
			w := &fuzzWriter{ResponseRecorder: httptest.NewRecorder(), c: c, br: br}
			n.mu.Lock()
			n.cur = i
			n.mu.Unlock()
			bound, boundPort := c.expect, c.port
			if state != nil {
				bound = strings.ToLower(state.ServerName)
				if boundPort == 0 {
					boundPort = 443
				}
			}
			// Where the request asks to go, as net/url reads it.
			authority, def := req.Host, uint16(0)
			if req.Method != http.MethodConnect {
				def = 80
				if state != nil {
					def = 443
				}
				if c.port != 0 {
					def = c.port
				}
				if req.URL.IsAbs() {
					authority = req.URL.Host
				}
			}
			host, port, ok := fuzzTarget(authority, def)
			wrote := len(sandbox.out.String())

			g.ServeHTTP(w, req)
			req.Body.Close()

			for _, d := range n.dialsOf(i) {
				dh, dp := splitAddr(d.addr)
				switch {
				case !fuzzAllowed(dh, dp):
					t.Fatalf("request %d (%s %s, Host %q): dialed %s, which the policy refuses", i, req.Method, req.URL, req.Host, d.addr)
				case !ok || dh != host || dp != port:
					t.Fatalf("request %d (%s %s, Host %q): dialed %s, but it names %s:%d", i, req.Method, req.URL, req.Host, d.addr, host, port)
				case bound != "" && (dh != bound || dp != boundPort):
					t.Fatalf("request %d (%s %s, Host %q): dialed %s on a connection bound to %s:%d", i, req.Method, req.URL, req.Host, d.addr, bound, boundPort)
				case (d.kind == "raw") != (req.Method == http.MethodConnect) || (d.kind == "https") != (state != nil):
					t.Fatalf("request %d (%s %s, Host %q): a %s dial to %s", i, req.Method, req.URL, req.Host, d.kind, d.addr)
				}
			}
			if !w.hijacked {
				continue
			}
			if req.Method != http.MethodConnect {
				t.Fatalf("request %d (%s %s) took over the connection", i, req.Method, req.URL)
			}
			if !strings.HasPrefix(sandbox.out.String()[wrote:], "HTTP/1.1 200 ") {
				break
			}
			if !ok || !fuzzAllowed(host, port) || bound != "" || c.expect != host || c.port != port {
				t.Fatalf("CONNECT %q (bound to %q): tunnel to %s:%d, want one to %s:%d only if the policy allows it", req.Host, bound, c.expect, c.port, host, port)
			}
			var next *queue
			switch port {
			case 443:
				next = g.tlsQ
			case 80:
				next = g.httpQ
			default:
				// A relay: the rest of the input goes upstream as bytes.
				break requests
			}
			select {
			case got := <-next.ch:
				if got != c {
					t.Fatal("CONNECT handed on another connection")
				}
			default:
				t.Fatalf("CONNECT %s:%d was not handed to the server for its port", host, port)
			}
			if port == 443 {
				if !fuzzHandshake(t, g, c, sni) {
					break
				}
				state = &tls.ConnectionState{ServerName: sni}
			}
			br = bufio.NewReader(c)
		}
		n.wg.Wait()
		for _, s := range n.seen {
			dh, dp := splitAddr(s.addr)
			if h, p, ok := fuzzTarget(s.host, map[bool]uint16{false: 80, true: 443}[s.kind == "https"]); !ok || h != dh || p != dp {
				t.Fatalf("dialed %s, but the upstream got Host %q", s.addr, s.host)
			}
			for _, sec := range fuzzSecrets() {
				full := sec.Value
				if sec.Prefix != "" {
					full = sec.Prefix + " " + full
				}
				if fuzzBinds(sec.Name, dh, s.kind == "https") {
					if v := s.header.Values(sec.Header); len(v) != 1 || v[0] != full {
						t.Fatalf("%s request to %s: %s is %q, want secret %s", s.kind, s.addr, sec.Header, v, sec.Name)
					}
					continue
				}
				for k, vv := range s.header {
					for _, v := range vv {
						if strings.Contains(v, sec.Value) {
							t.Fatalf("%s request to %s carries secret %s in %s", s.kind, s.addr, sec.Name, k)
						}
						if strings.Contains(v, sec.Placeholder) {
							t.Fatalf("%s request to %s carries the placeholder of secret %s in %s", s.kind, s.addr, sec.Name, k)
						}
					}
				}
			}
		}
	})
}

// FuzzHostPort feeds hostPort a Host header or CONNECT target: when it
// accepts one, the name is normalized and is the host (and port) that
// net/url reads there, the policy check on it agrees with fuzzAllowed,
// and matchHost binds each secret to it exactly when fuzzBinds does.
func FuzzHostPort(f *testing.F) {
	for _, s := range []string{
		"api.example.com", "api.example.com:443", "API.Example.COM.:443", "a.svc.example.com",
		"192.0.2.10:7000", "192.0.2.10.:7000", "evil.com@api.example.com:443", "evil.com#api.example.com",
		"api.example.com.evil.com:443", "[api.example.com]:443", "[::1]:443", "::1", "api.example.com:443:443",
		"api%2eexample.com:443", "api.example.com:0443", "api.example.com:", ".svc.example.com:80", "a..svc.example.com",
		"-a.svc.example.com:80", "10.213.0.1:80", "0x7f.1:80", "api.example.com :443",
	} {
		f.Add(s, uint16(443))
	}
	p, err := netpolicy.Parse("allow", fuzzPolicy)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string, def uint16) {
		name, port, err := hostPort(s, def)
		if err != nil {
			return
		}
		if h, pt, ok := fuzzTarget(s, def); !ok || h != name || pt != port {
			t.Fatalf("hostPort(%q) = %s:%d, but net/url reads %s:%d", s, name, port, h, pt)
		}
		if n, err := netpolicy.NormalizeName(name); err != nil || n != name {
			t.Fatalf("hostPort(%q) = %q, not a normalized name", s, name)
		}
		if port != 0 && allowed(p, name, port) != fuzzAllowed(name, port) {
			t.Fatalf("hostPort(%q) = %s:%d: policy check says %v", s, name, port, allowed(p, name, port))
		}
		for _, sec := range fuzzSecrets() {
			if matchHost(sec.Host, name) != fuzzBinds(sec.Name, name, true) {
				t.Fatalf("hostPort(%q) = %s: matchHost(%q) = %v", s, name, sec.Host, matchHost(sec.Host, name))
			}
		}
	})
}

// TestInjectDropsUnboundPlaceholders: a header carrying the placeholder
// of a secret that is not bound to the request's destination (or not
// over its scheme) does not go upstream; the bound secret replaces its
// own placeholder; other headers are left alone.
func TestInjectDropsUnboundPlaceholders(t *testing.T) {
	g := &Gateway{secrets: fuzzSecrets()}
	for _, c := range []struct {
		name, scheme string
		want         map[string]string
	}{
		{"api.example.com", "https", map[string]string{"Authorization": "Bearer v4lue-API-7c1e0b", "X-Svc-Key": "", "X-Other-Key": "", "X-Mine": "kept"}},
		{"api.example.com", "http", map[string]string{"Authorization": "", "X-Svc-Key": "", "X-Other-Key": "", "X-Mine": "kept"}},
		{"a.svc.example.com", "http", map[string]string{"Authorization": "", "X-Svc-Key": "v4lue-SVC-93ad2f", "X-Other-Key": "", "X-Mine": "kept"}},
	} {
		req := httptest.NewRequest("GET", "http://x/", nil)
		req.Header.Set("Authorization", "Bearer tine-secret-placeholder-API")
		req.Header.Set("X-Svc-Key", "tine-secret-placeholder-SVC")
		req.Header.Add("X-Other-Key", "a")
		req.Header.Add("X-Other-Key", "key=tine-secret-placeholder-OTHER")
		req.Header.Set("X-Mine", "kept")
		g.inject(req, c.name, 443, c.scheme)
		for k, v := range c.want {
			if got := strings.Join(req.Header.Values(k), ","); got != v {
				t.Errorf("%s to %s: %s is %q, want %q", c.scheme, c.name, k, got, v)
			}
		}
	}
}
