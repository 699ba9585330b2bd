package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"tine/netpolicy"
)

// hostPort splits a Host header or CONNECT target, with def as the port
// when it has none, and normalizes the name.
func hostPort(s string, def uint16) (string, uint16, error) {
	host, port := s, def
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return "", 0, fmt.Errorf("bad port in %q", s)
		}
		host, port = h, uint16(n)
	}
	if strings.ContainsAny(host, "[]:") {
		return "", 0, fmt.Errorf("IPv6 destination %q: sandboxes have no IPv6", s)
	}
	if n, err := netpolicy.NormalizeName(host); err == nil {
		host = n
	} else if !isIPv4(host) {
		return "", 0, fmt.Errorf("bad host %q: %v", s, err)
	}
	return host, port, nil
}

func isIPv4(s string) bool {
	ip := net.ParseIP(s)
	return ip != nil && ip.To4() != nil && !strings.Contains(s, ":")
}

func connOf(r *http.Request) *conn {
	c, _ := r.Context().Value(connKey{}).(*conn)
	return c
}

// ServeHTTP serves the sandbox's plain HTTP (port 80, or a proxy request
// on the proxy port), its TLS-terminated HTTPS, and CONNECT.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := connOf(r)
	if c == nil {
		http.Error(w, "tine gateway: unknown connection", http.StatusInternalServerError)
		return
	}
	if r.Method == http.MethodConnect {
		g.connect(w, r, c)
		return
	}
	scheme, def := "http", uint16(80)
	if r.TLS != nil {
		scheme, def = "https", 443
	}
	if c.port != 0 {
		def = c.port
	}
	hostHdr := r.Host
	if r.URL.IsAbs() {
		if r.TLS != nil || r.URL.Scheme != "http" {
			http.Error(w, "tine gateway: only http:// URLs are proxied in this form; use CONNECT for https", http.StatusBadRequest)
			return
		}
		hostHdr = r.URL.Host
	}
	name, port, err := hostPort(hostHdr, def)
	if err != nil {
		http.Error(w, "tine gateway: "+err.Error(), http.StatusBadRequest)
		return
	}
	if r.TLS != nil || c.expect != "" {
		// The name was checked at the TLS handshake (SNI) or the CONNECT:
		// every request on the connection must be for it, or a request
		// for a forbidden host could ride an allowed connection.
		want := c.expect
		if r.TLS != nil {
			want = strings.ToLower(r.TLS.ServerName)
		}
		if name != want || port != def {
			g.mu.Lock()
			g.deny(name, port)
			g.mu.Unlock()
			http.Error(w, fmt.Sprintf("tine gateway: Host %q does not match the connection's name %q", hostHdr, want), http.StatusMisdirectedRequest)
			return
		}
	}
	if !g.use(c, name, port) {
		http.Error(w, fmt.Sprintf("tine gateway: %s:%d is not allowed by sandbox %s's network policy", name, port, g.cfg.Sandbox), http.StatusForbidden)
		return
	}
	target := net.JoinHostPort(name, strconv.Itoa(int(port)))
	rp := &httputil.ReverseProxy{
		Transport: g.transport,
		ErrorLog:  quietLog(),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = target
			pr.Out.Host = pr.In.Host
			if r.URL.IsAbs() {
				pr.Out.Host = r.URL.Host
			}
			pr.Out.Header.Del("Proxy-Authorization")
			pr.Out.Header.Del("Proxy-Connection")
			g.inject(pr.Out, name, port, scheme)
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "tine gateway: upstream "+target+": "+err.Error(), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

// connect serves CONNECT: the target must be allowed; TLS targets (port
// 443) and HTTP ones (port 80) go on to the TLS or HTTP server bound to
// that name, so SNI and Host are checked as on the direct ports; other
// ports are relayed as bytes.
func (g *Gateway) connect(w http.ResponseWriter, r *http.Request, c *conn) {
	if c.expect != "" || r.TLS != nil {
		http.Error(w, "tine gateway: CONNECT inside a proxied connection is refused", http.StatusForbidden)
		return
	}
	name, port, err := hostPort(r.Host, 0)
	if err == nil && port == 0 {
		err = errors.New("CONNECT needs host:port")
	}
	if err != nil {
		http.Error(w, "tine gateway: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !g.use(c, name, port) {
		http.Error(w, fmt.Sprintf("tine gateway: %s:%d is not allowed by sandbox %s's network policy", name, port, g.cfg.Sandbox), http.StatusForbidden)
		return
	}
	var up net.Conn
	if port != 443 && port != 80 {
		up, err = g.cfg.Dial(r.Context(), "tcp", net.JoinHostPort(name, strconv.Itoa(int(port))))
		if err != nil {
			http.Error(w, "tine gateway: "+err.Error(), http.StatusBadGateway)
			return
		}
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "tine gateway: cannot take over the connection", http.StatusInternalServerError)
		return
	}
	nc, brw, err := hj.Hijack()
	if err != nil {
		if up != nil {
			up.Close()
		}
		return
	}
	if n := brw.Reader.Buffered(); n > 0 {
		c.pre, _ = brw.Reader.Peek(n)
		c.pre = append([]byte(nil), c.pre...)
	}
	nc.SetDeadline(time.Time{})
	if _, err := io.WriteString(nc, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		nc.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	c.expect, c.port = name, port
	switch port {
	case 443:
		g.tlsQ.push(c)
	case 80:
		g.httpQ.push(c)
	default:
		c.setPeer(up)
		go func() {
			io.Copy(up, c)
			if tc, ok := up.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}()
		go func() {
			io.Copy(c, up)
			c.Close()
		}()
	}
}

// certificate checks a TLS client's SNI against the policy (and against
// the CONNECT target when it came through one) and returns a leaf for it.
func (g *Gateway) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	c, _ := hello.Conn.(*conn)
	if c == nil {
		return nil, errors.New("unknown connection")
	}
	sni := strings.ToLower(hello.ServerName)
	if sni == "" {
		return nil, errors.New("tine gateway: TLS without a server name (SNI) is refused")
	}
	port := uint16(443)
	if c.expect != "" {
		if sni != c.expect {
			g.mu.Lock()
			g.deny(sni, c.port)
			g.mu.Unlock()
			return nil, fmt.Errorf("tine gateway: SNI %q does not match the CONNECT target %q", sni, c.expect)
		}
		port = c.port
	}
	if !g.use(c, sni, port) {
		return nil, fmt.Errorf("tine gateway: %s is not allowed", sni)
	}
	return g.cfg.CA.Leaf(sni)
}
