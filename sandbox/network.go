package sandbox

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"tine/gateway"
	"tine/guestagent/proto"
	"tine/internal/atomicfile"
	"tine/netpolicy"
)

// NetworkOptions configures the host side of sandboxes' networks.
type NetworkOptions struct {
	// Dial makes the gateway's upstream connections (nil: from the host,
	// refusing the host's own and private addresses unless allowed by
	// address).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RootCAs verify upstream HTTPS servers (nil: the host's roots).
	RootCAs *x509.CertPool
	// Audit receives policy changes, credentialed requests and counts of
	// denied connections.
	Audit gateway.Auditor
}

// networks is the Manager's live sandbox networks.
type networks struct {
	opts NetworkOptions
	mu   sync.Mutex
	live map[string]*sandboxNet
	expo map[string]*exposures // forwarded ports, by sandbox
}

// sandboxNet is one running sandbox's veth, filter and gateway.
type sandboxNet struct {
	link *gateway.Link
	gw   *gateway.Gateway
	api  net.Listener // its API over HTTP (insidenet.go); nil: none
}

// netPider is an Instance whose network namespace the host can attach to.
type netPider interface{ NetPid() int }

func (m *Manager) networkFile(name string) string { return filepath.Join(m.dir(name), "network.json") }
func (m *Manager) caFile(name string) string      { return filepath.Join(m.dir(name), "gateway-ca.pem") }

// Network returns a sandbox's network policy.
func (m *Manager) Network(name string) (*netpolicy.Policy, error) {
	if _, err := os.Stat(m.dir(name)); !nameRE().MatchString(name) || err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
	}
	var p netpolicy.Policy
	if err := readJSON(m.networkFile(name), &p); errors.Is(err, os.ErrNotExist) {
		return netpolicy.Parse("", nil)
	} else if err != nil {
		return nil, fmt.Errorf("sandbox %q: network policy: %w", name, err)
	}
	return p.Compile()
}

// initNetwork writes a new sandbox's policy: the one given, or a fork's
// parent's.
func (m *Manager) initNetwork(name string, p *netpolicy.Policy, forkedFrom string) error {
	if p == nil && forkedFrom != "" {
		var err error
		if p, err = m.Network(forkedFrom); err != nil {
			return err
		}
		// The fork's layer already trusts the parent's CA: it keeps it.
		if b, err := os.ReadFile(m.caFile(forkedFrom)); err == nil {
			if err := atomicfile.WriteFile(m.caFile(name), b, 0o600); err != nil {
				return err
			}
		}
	}
	if p == nil {
		return nil
	}
	p, err := p.Compile()
	if err != nil {
		return err
	}
	if p.GetMode() == netpolicy.None && len(p.Allow) == 0 {
		return nil // what no file says: no synced write on a fork's path
	}
	return writeJSON(m.networkFile(name), p)
}

// SetNetwork changes a sandbox's network policy. On a running sandbox the
// filter is replaced at once and the gateway closes every connection the
// new policy does not allow.
func (m *Manager) SetNetwork(ctx context.Context, name string, p *netpolicy.Policy) error {
	p, err := p.Compile()
	if err != nil {
		return err
	}
	if _, err := m.Get(name); err != nil {
		return fmt.Errorf("set network of sandbox %q: %w", name, err)
	}
	if p.GetMode() != netpolicy.None || len(p.Allow) > 0 {
		if err := m.checkFeature(name, "network policy", func(f Features) bool { return f.Network }); err != nil {
			return err
		}
	}
	if err := writeJSON(m.networkFile(name), p); err != nil {
		return err
	}
	l, err := m.running(name)
	if err != nil {
		return nil // applied at the next start
	}
	m.net.mu.Lock()
	sn := m.net.live[name]
	m.net.mu.Unlock()
	switch {
	case sn == nil && p.GetMode() == netpolicy.None:
		return nil
	case sn == nil:
		return m.startNetwork(ctx, name, l.inst)
	case p.GetMode() == netpolicy.None:
		err := sn.link.Apply(ctx, p)
		sn.gw.SetPolicy(p)
		m.stopNetwork(name)
		return err
	}
	if needsForwarding(p) {
		if err := gateway.EnableForwarding(); err != nil {
			return err
		}
	}
	// The filter first, then the gateway: a connection the gateway has not
	// cut yet can no longer reach an address the new policy dropped.
	if err := sn.link.Apply(ctx, p); err != nil {
		return fmt.Errorf("set network of sandbox %q: %w", name, err)
	}
	sn.gw.SetPolicy(p)
	return nil
}

func needsForwarding(p *netpolicy.Policy) bool {
	if p.GetMode() == netpolicy.Open {
		return true
	}
	for _, r := range p.Rules() {
		if r.Name == "" {
			return true
		}
	}
	return false
}

// startNetwork attaches a running sandbox to its network when its policy
// is allow or open: the filter, the veth, the gateway, and, inside, the
// resolver's address in /etc/resolv.conf and the sandbox's CA in its
// trust store (its own layer only).
func (m *Manager) startNetwork(ctx context.Context, name string, inst Instance) (err error) {
	defer func() {
		if err == nil && m.AutoExpose(name) {
			err = m.startAutoExpose(name)
		}
	}()
	p, err := m.Network(name)
	if err != nil || p.GetMode() == netpolicy.None {
		return err
	}
	np, ok := inst.(netPider)
	if !ok || np.NetPid() == 0 {
		return fmt.Errorf("sandbox %q: runtime %s cannot attach a network (use network mode none)", name, m.runtimeNameOf(name))
	}
	if needsForwarding(p) {
		if err := gateway.EnableForwarding(); err != nil {
			return fmt.Errorf("sandbox %q: enable IPv4 forwarding: %w", name, err)
		}
	}
	ca, err := gateway.LoadOrNewCA(m.caFile(name), name)
	if err != nil {
		return err
	}
	link, err := gateway.Attach(ctx, np.NetPid(), p, gateway.Ports{})
	if err != nil {
		return fmt.Errorf("sandbox %q: attach network: %w", name, err)
	}
	var local []string
	m.mu.Lock()
	if _, ok := m.inside.(InsideHTTP); ok {
		local = []string{InsideName}
	}
	m.mu.Unlock()
	gw, err := gateway.Start(gateway.Config{Sandbox: name, Addr: link.Gateway, Device: link.HostName, Peer: link.Addr,
		Local: local, Policy: p, CA: ca,
		Dial: m.net.opts.Dial, RootCAs: m.net.opts.RootCAs, Audit: m.netAuditor(name), Secrets: m.boundSecrets(name)})
	if err != nil {
		link.Close()
		return err
	}
	sn := &sandboxNet{link: link, gw: gw}
	if err := m.serveInsideHTTP(ctx, name, sn); err != nil {
		gw.Close()
		link.Close()
		return err
	}
	m.net.mu.Lock()
	if m.net.live == nil {
		m.net.live = map[string]*sandboxNet{}
	}
	m.net.live[name] = sn
	m.net.mu.Unlock()
	if err := m.configureGuestNetwork(ctx, name, link, ca); err != nil {
		m.stopNetwork(name)
		return err
	}
	return nil
}

// guestNetworkScript points the sandbox's resolver at the gateway and
// adds the sandbox's CA to its trust stores (in its own layer), once.
const guestNetworkScript = `set -e
rm -f /etc/resolv.conf
printf 'nameserver %s\noptions ndots:0\n' "$1" > /etc/resolv.conf
mkdir -p /usr/local/share/ca-certificates
printf '%s' "$2" > /usr/local/share/ca-certificates/tine-sandbox.crt
f=/etc/ssl/certs/ca-certificates.crt
if [ -f "$f" ] && ! grep -qF "$3" "$f"; then
	printf '%s' "$2" >> "$f"
elif [ ! -f "$f" ]; then
	mkdir -p /etc/ssl/certs
	printf '%s' "$2" > "$f"
fi
`

func (m *Manager) configureGuestNetwork(ctx context.Context, name string, link *gateway.Link, ca *gateway.CA) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pem := string(ca.CertPEM())
	marker := pem[len("-----BEGIN CERTIFICATE-----\n"):][:60]
	c, err := m.Agent(ctx, name)
	if err != nil {
		return fmt.Errorf("sandbox %q: configure its resolver and trust store: %w", name, err)
	}
	p, err := c.Exec(ctx, proto.ExecRequest{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		Argv: []string{"sh", "-c", guestNetworkScript, "tine-net", link.Gateway.String(), pem, marker}})
	if err != nil {
		return fmt.Errorf("sandbox %q: configure its resolver and trust store: %w", name, err)
	}
	var out bytes.Buffer
	go io.Copy(io.Discard, p.Stdout)
	io.Copy(&out, io.LimitReader(p.Stderr, 4096))
	ex, err := p.Wait(ctx)
	if err == nil && ex.Code != 0 {
		err = fmt.Errorf("exit %d: %s", ex.Code, out.String())
	}
	if err != nil {
		return fmt.Errorf("sandbox %q: configure its resolver and trust store: %w", name, err)
	}
	return nil
}

// (Manager.audit, which records a sandbox's events in its audit log and
// hands them to the network options' auditor too, is in audit.go.)

// stopNetwork closes a sandbox's gateway and removes its veth.
func (m *Manager) stopNetwork(name string) {
	m.net.mu.Lock()
	sn := m.net.live[name]
	delete(m.net.live, name)
	m.net.mu.Unlock()
	if sn != nil {
		if sn.api != nil {
			sn.api.Close()
		}
		sn.gw.Close()
		sn.link.Close()
	}
}

// NetworkStatus is a running sandbox's network as it is now.
type NetworkStatus struct {
	Policy  *netpolicy.Policy `json:"policy"`
	Gateway string            `json:"gateway,omitempty"` // the host end's address
	Address string            `json:"address,omitempty"` // the sandbox's
	// Denied counts refused destinations at the gateway since the last
	// call.
	Denied map[string]int `json:"denied,omitempty"`
}

// NetworkState returns a sandbox's policy and, when it runs attached,
// its addresses and denied destinations.
func (m *Manager) NetworkState(name string) (*NetworkStatus, error) {
	p, err := m.Network(name)
	if err != nil {
		return nil, err
	}
	st := &NetworkStatus{Policy: p}
	m.net.mu.Lock()
	sn := m.net.live[name]
	m.net.mu.Unlock()
	if sn != nil {
		st.Gateway, st.Address = sn.link.Gateway.String(), sn.link.Addr.String()
		st.Denied = sn.gw.Denied()
	}
	return st, nil
}
