// Package gateway is the host side of a sandbox's network: one per
// sandbox, listening on the host end of the sandbox's veth. It answers
// DNS for allowed names only (with its own address, never forwarding a
// query), proxies HTTP after checking the Host header, terminates TLS
// with the sandbox's own CA after checking the SNI (and then checks that
// each request's Host is that name), relays CONNECT to allowed
// destinations, and swaps secrets into requests bound to them. Every
// connection it serves is tracked, so that a policy change closes the
// ones the new policy no longer allows. The packet filter in the
// sandbox's namespace (see Link) is what makes the gateway the only way
// out. Each gateway serves one sandbox: its sockets are bound to that
// sandbox's veth and answer only its address, and it never dials into
// the sandboxes' range (listen.go).
package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"tine/netpolicy"
)

// Auditor records events (an append-only log kept elsewhere).
type Auditor interface {
	Append(kind string, fields map[string]any) error
}

// Ports are the gateway's ports on its address.
type Ports struct {
	DNS, HTTP, HTTPS, Proxy uint16
	// API is the port of the sandbox's own API on the same address,
	// served by the host beside the gateway (see Link.Listen).
	API uint16
}

// DefaultPorts are 53, 80, 443, 3128 (the CONNECT/HTTP proxy) and 7380
// (the sandbox's API).
var DefaultPorts = Ports{DNS: 53, HTTP: 80, HTTPS: 443, Proxy: 3128, API: 7380}

// Config configures one sandbox's gateway.
type Config struct {
	// Sandbox names the sandbox in errors and audit records.
	Sandbox string
	// Addr is the address the gateway listens on (the host end of the
	// sandbox's veth) and the one its resolver answers with.
	Addr netip.Addr
	// Device is the host end of the sandbox's veth: every socket of the
	// gateway is bound to it (required).
	Device string
	// Peer is the sandbox's address, the only one served (required).
	Peer netip.Addr
	// Local are names the resolver answers with Addr whatever the policy
	// (the host's own services for this sandbox, such as its API).
	Local []string
	// Ports default to DefaultPorts.
	Ports Ports
	// Policy is the sandbox's policy (nil: none).
	Policy *netpolicy.Policy
	// CA terminates the sandbox's TLS (required).
	CA *CA
	// Dial makes upstream connections; nil dials from the host with
	// net.Dialer, refusing loopback, link-local, private and unspecified
	// addresses unless the policy allows that address itself. Addresses
	// in Subnet (other sandboxes and their gateways) are refused whatever
	// the policy says, with either dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RootCAs verify upstream servers (nil: the host's roots).
	RootCAs *x509.CertPool
	// Secrets are swapped into requests to their destinations.
	Secrets []Secret
	// Audit, when set, receives credentialed requests, policy changes
	// and counts of denied connections.
	Audit Auditor
}

// Gateway is a running gateway.
type Gateway struct {
	cfg       Config
	transport *http.Transport
	httpSrv   *http.Server
	tlsSrv    *http.Server
	httpQ     *queue
	tlsQ      *queue
	lns       []net.Listener
	udp       net.PacketConn
	wg        sync.WaitGroup

	mu      sync.Mutex
	policy  *netpolicy.Policy
	secrets []Secret
	conns   map[*conn]struct{}
	denied  map[string]int
	creds   map[credKey]*credUse
	closed  bool
}

// Start listens on cfg.Addr and serves until Close.
func Start(cfg Config) (*Gateway, error) {
	if cfg.CA == nil {
		return nil, errors.New("gateway: no CA given")
	}
	if cfg.Device == "" || !cfg.Peer.IsValid() {
		return nil, fmt.Errorf("gateway for sandbox %s: no device or sandbox address given", cfg.Sandbox)
	}
	if cfg.Ports == (Ports{}) {
		cfg.Ports = DefaultPorts
	}
	g := &Gateway{cfg: cfg, policy: cfg.Policy, secrets: cfg.Secrets, conns: map[*conn]struct{}{}, denied: map[string]int{}}
	if g.cfg.Dial == nil {
		g.cfg.Dial = g.guardedDial
	}
	g.cfg.Dial = refuseSandboxes(g.cfg.Dial)
	g.transport = &http.Transport{
		DialContext:           g.cfg.Dial,
		TLSClientConfig:       &tls.Config{RootCAs: cfg.RootCAs},
		Proxy:                 nil,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		TLSHandshakeTimeout:   30 * time.Second,
	}
	connCtx := func(ctx context.Context, c net.Conn) context.Context {
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn()
		}
		if cc, ok := c.(*conn); ok {
			return context.WithValue(ctx, connKey{}, cc)
		}
		return ctx
	}
	g.httpQ, g.tlsQ = newQueue(cfg.Addr), newQueue(cfg.Addr)
	g.httpSrv = &http.Server{Handler: g, ConnContext: connCtx, ReadHeaderTimeout: time.Minute, ErrorLog: quietLog()}
	g.tlsSrv = &http.Server{Handler: g, ConnContext: connCtx, ReadHeaderTimeout: time.Minute, ErrorLog: quietLog(),
		TLSConfig: &tls.Config{GetCertificate: g.certificate, NextProtos: []string{"http/1.1"}}}
	fail := func(err error) (*Gateway, error) {
		g.Close()
		return nil, fmt.Errorf("gateway for sandbox %s: %w", cfg.Sandbox, err)
	}
	for _, l := range []struct {
		port uint16
		q    *queue
	}{{cfg.Ports.HTTP, g.httpQ}, {cfg.Ports.Proxy, g.httpQ}, {cfg.Ports.HTTPS, g.tlsQ}} {
		ln, err := ListenTCP(context.Background(), cfg.Device, netip.AddrPortFrom(cfg.Addr, l.port), cfg.Peer)
		if err != nil {
			return fail(err)
		}
		g.lns = append(g.lns, ln)
		g.wg.Add(1)
		go g.accept(ln, l.q, l.port)
	}
	dnsTCP, err := ListenTCP(context.Background(), cfg.Device, netip.AddrPortFrom(cfg.Addr, cfg.Ports.DNS), cfg.Peer)
	if err != nil {
		return fail(err)
	}
	g.lns = append(g.lns, dnsTCP)
	if g.udp, err = listenUDP(context.Background(), cfg.Device, netip.AddrPortFrom(cfg.Addr, cfg.Ports.DNS)); err != nil {
		return fail(err)
	}
	g.wg.Add(2)
	go g.serveDNSUDP()
	go g.serveDNSTCP(dnsTCP)
	go g.httpSrv.Serve(g.httpQ)
	go g.tlsSrv.Serve(tls.NewListener(g.tlsQ, g.tlsSrv.TLSConfig))
	return g, nil
}

// Close stops the gateway and closes every connection it serves.
func (g *Gateway) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	conns := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	for _, ln := range g.lns {
		ln.Close()
	}
	if g.udp != nil {
		g.udp.Close()
	}
	g.httpQ.Close()
	g.tlsQ.Close()
	g.httpSrv.Close()
	g.tlsSrv.Close()
	for _, c := range conns {
		c.Close()
	}
	g.transport.CloseIdleConnections()
	g.wg.Wait()
	g.flushDenied()
	g.flushCredentials()
	return nil
}

// Policy returns the policy in force.
func (g *Gateway) Policy() *netpolicy.Policy {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.policy
}

// SetPolicy puts p in force and closes every connection to a destination
// p does not allow; it returns how many it closed.
func (g *Gateway) SetPolicy(p *netpolicy.Policy) int {
	g.mu.Lock()
	g.policy = p
	var cut []*conn
	for c := range g.conns {
		for d := range c.dests {
			if !allowed(p, d.name, d.port) {
				cut = append(cut, c)
				break
			}
		}
	}
	g.mu.Unlock()
	for _, c := range cut {
		c.Close()
	}
	g.transport.CloseIdleConnections()
	g.audit("network.policy", map[string]any{"mode": string(p.GetMode()), "allow": allowList(p), "cut": len(cut)})
	return len(cut)
}

// SetSecrets replaces the secrets swapped into requests.
func (g *Gateway) SetSecrets(s []Secret) {
	g.mu.Lock()
	g.secrets = s
	g.mu.Unlock()
}

// allowed says whether p lets the sandbox reach name at port through
// the gateway; never an address of the sandboxes' range.
func allowed(p *netpolicy.Policy, name string, port uint16) bool {
	if a, err := netip.ParseAddr(name); err == nil {
		return !Subnet.Contains(a.Unmap()) && p.AllowIP(a, port)
	}
	return p.AllowName(name, port)
}

// use records that c reaches name:port and says whether the policy in
// force allows it; both under g.mu, so a policy change either sees the
// destination or is seen by this check.
func (g *Gateway) use(c *conn, name string, port uint16) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	ok := allowed(g.policy, name, port)
	if !ok {
		g.deny(name, port)
		return false
	}
	if c != nil {
		if c.dests == nil {
			c.dests = map[dest]struct{}{}
		}
		if len(c.dests) < 64 {
			c.dests[dest{name, port}] = struct{}{}
		}
	}
	return true
}

// deny counts a denied destination (g.mu held).
func (g *Gateway) deny(name string, port uint16) {
	if len(g.denied) < 1024 {
		g.denied[net.JoinHostPort(name, strconv.Itoa(int(port)))]++
	}
}

// Denied returns the denied destinations and their counts since the last
// call (they also go to the audit log, counted, at Close).
func (g *Gateway) Denied() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	d := g.denied
	g.denied = map[string]int{}
	return d
}

func (g *Gateway) flushDenied() {
	if d := g.Denied(); len(d) > 0 {
		g.audit("network.denied", map[string]any{"counts": d})
	}
}

func (g *Gateway) audit(kind string, f map[string]any) {
	if g.cfg.Audit == nil {
		return
	}
	f["sandbox"] = g.cfg.Sandbox
	g.cfg.Audit.Append(kind, f)
}

// guardedDial dials from the host, refusing addresses of the host and its
// private networks unless the policy allows the address itself: an
// allowed name must not lead to the host's own services. Addresses of
// the sandboxes' range are refused whatever the policy.
func (g *Gateway) guardedDial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 30 * time.Second, ControlContext: func(ctx context.Context, network, address string, _ syscallRawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return err
		}
		a := ap.Addr().Unmap()
		if Subnet.Contains(a) {
			return errSandboxRange(a)
		}
		if internal(a) && !g.Policy().AllowIP(a, ap.Port()) {
			return fmt.Errorf("gateway: %s is a host-internal address; allow it by address to reach it", a)
		}
		return nil
	}}
	return d.DialContext(ctx, network, addr)
}

// refuseSandboxes wraps dial so that it never dials an address of the
// sandboxes' range: one sandbox must not reach another, or another's
// gateway, through its own.
func refuseSandboxes(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("gateway: dial %q: %w", addr, err)
		}
		if a, err := netip.ParseAddr(host); err == nil && Subnet.Contains(a.Unmap()) {
			return nil, errSandboxRange(a)
		}
		return dial(ctx, network, addr)
	}
}

func errSandboxRange(a netip.Addr) error {
	return fmt.Errorf("gateway: %s is in the sandboxes' range %s, which no sandbox reaches through the gateway", a, Subnet)
}

// internal says whether a is loopback, link-local, private, shared
// (100.64/10), unspecified or multicast.
func internal(a netip.Addr) bool {
	return a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsPrivate() ||
		a.IsUnspecified() || a.IsMulticast() || netip.MustParsePrefix("100.64.0.0/10").Contains(a) || !a.Is4()
}

func allowList(p *netpolicy.Policy) []string {
	if p == nil {
		return nil
	}
	return p.Allow
}
