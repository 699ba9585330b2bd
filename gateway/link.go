package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"

	"tine/netpolicy"
)

// Subnet is where sandboxes' veth pairs get their /30 networks: the host
// end is .1 of each, the sandbox end .2.
var Subnet = netip.MustParsePrefix("10.213.0.0/16")

// hostPrefix starts every host-side veth name.
const hostPrefix = "tn"

// Link is a sandbox's veth pair: eth0 in the sandbox's network namespace,
// the host end beside the gateway, and the packet filter (nftables table
// inet tine) in the sandbox's namespace, which the sandbox cannot change
// (it has no CAP_NET_ADMIN).
type Link struct {
	Pid      int        // a process in the sandbox's network namespace
	HostName string     // the host end's interface name
	Gateway  netip.Addr // the host end's address
	Addr     netip.Addr // the sandbox's address
	Ports    Ports
}

var allocMu sync.Mutex

// Attach gives the network namespace of process pid a veth to the host
// with the filter for p in place before the link comes up, so that the
// sandbox is never connected without it.
func Attach(ctx context.Context, pid int, p *netpolicy.Policy, ports Ports) (*Link, error) {
	if ports == (Ports{}) {
		ports = DefaultPorts
	}
	allocMu.Lock()
	defer allocMu.Unlock()
	gw, err := freeNet()
	if err != nil {
		return nil, err
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	l := &Link{Pid: pid, HostName: fmt.Sprintf("%s%08x", hostPrefix, binary.BigEndian.Uint32(rnd[:])), Gateway: gw, Addr: gw.Next(), Ports: ports}
	if err := l.Apply(ctx, p); err != nil {
		return nil, err
	}
	if err := l.inNS(ctx, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"ip", "link", "add", l.HostName, "type", "veth", "peer", "name", "eth0", "netns", fmt.Sprint(pid)},
		{"ip", "addr", "add", gw.String() + "/30", "dev", l.HostName},
		{"ip", "link", "set", l.HostName, "up"},
	}
	for _, s := range steps {
		if err := run(ctx, nil, s...); err != nil {
			l.Close()
			return nil, err
		}
	}
	for _, s := range [][]string{
		{"ip", "addr", "add", l.Addr.String() + "/30", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", gw.String()},
	} {
		if err := l.inNS(ctx, s...); err != nil {
			l.Close()
			return nil, err
		}
	}
	if err := hostTable(ctx, ports); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// freeNet returns the host address of a /30 in Subnet that no interface
// of the host uses.
func freeNet() (netip.Addr, error) {
	a, err := FreeSlash30(Subnet, nil)
	if err != nil {
		return a, fmt.Errorf("%w for a sandbox network", err)
	}
	return a.Next(), nil
}

// FreeSlash30 returns the network address of a /30 in subnet that no
// interface of the host has an address in and taken (when given) does
// not claim, trying them from a random start.
func FreeSlash30(subnet netip.Prefix, taken func(netip.Addr) bool) (netip.Addr, error) {
	subnet = subnet.Masked()
	used := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list host addresses: %w", err)
	}
	for _, a := range addrs {
		if pf, err := netip.ParsePrefix(a.String()); err == nil && subnet.Contains(pf.Addr()) {
			b := pf.Addr().As4()
			b[3] &^= 3
			used[netip.AddrFrom4(b)] = true
		}
	}
	n := uint32(1) << (32 - subnet.Bits() - 2)
	var r [4]byte
	rand.Read(r[:])
	start := binary.BigEndian.Uint32(r[:]) % n
	base := binary.BigEndian.Uint32(subnet.Addr().AsSlice())
	for i := range n {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], base+(start+i)%n*4)
		a := netip.AddrFrom4(b)
		if !used[a] && (taken == nil || !taken(a)) {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free /30 left in %s", subnet)
}

// Close removes the veth pair (the sandbox's end goes with it).
func (l *Link) Close() error {
	return run(context.Background(), nil, "ip", "link", "del", l.HostName)
}

// inNS runs argv in the sandbox's network namespace.
func (l *Link) inNS(ctx context.Context, argv ...string) error {
	return run(ctx, nil, append([]string{"nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", l.Pid), "--"}, argv...)...)
}

func run(ctx context.Context, stdin []byte, argv ...string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Apply replaces the sandbox's filter with the one for p, atomically.
func (l *Link) Apply(ctx context.Context, p *netpolicy.Policy) error {
	rs := Ruleset(p, l.Gateway, l.Ports)
	return run(ctx, []byte(rs), "nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", l.Pid), "--", "nft", "-f", "-")
}

// Ruleset is the nftables ruleset of a sandbox's namespace for p: out
// through lo, to the gateway's ports, and (mode allow) to the listed
// addresses and CIDRs at their ports, or (mode open) to any IPv4 address;
// never to the sandboxes' range (Subnet) but its own gateway, whatever
// the list says; everything else, IPv6 included, is refused (TCP with a
// reset, so that a cut connection fails at once).
func Ruleset(p *netpolicy.Policy, gw netip.Addr, ports Ports) string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	w("add table inet tine")
	w("delete table inet tine")
	w("table inet tine {")
	w("  counter denied { }")
	w("  chain output {")
	w("    type filter hook output priority 0; policy drop;")
	w("    oifname \"lo\" accept")
	w("    meta nfproto ipv6 counter name denied reject with icmpx type admin-prohibited")
	w("    ip daddr %s udp dport %d accept", gw, ports.DNS)
	w("    ip daddr %s tcp dport { %s } accept", gw, ports.tcp())
	w("    ip daddr %s ct state established accept", gw)
	w("    ip daddr %s counter name denied reject with tcp reset", gw)
	// Other sandboxes and their gateways, whatever the list allows.
	w("    ip daddr %s meta l4proto tcp counter name denied reject with tcp reset", Subnet)
	w("    ip daddr %s counter name denied reject with icmpx type admin-prohibited", Subnet)
	switch p.GetMode() {
	case netpolicy.Open:
		w("    accept")
	case netpolicy.Allow:
		for _, r := range p.Rules() {
			if r.Name != "" {
				continue
			}
			if r.Lo == 0 && r.Hi == 0 {
				w("    ip daddr %s accept", r.Prefix)
			} else {
				w("    ip daddr %s meta l4proto { tcp, udp } th dport %d-%d accept", r.Prefix, r.Lo, r.Hi)
			}
		}
	}
	w("    meta l4proto tcp counter name denied reject with tcp reset")
	w("    counter name denied reject with icmpx type admin-prohibited")
	w("  }")
	w("  chain input {")
	w("    type filter hook input priority 0; policy drop;")
	w("    iifname \"lo\" accept")
	w("    ip saddr %s accept", gw)
	w("    ip saddr %s drop", Subnet)
	switch p.GetMode() {
	case netpolicy.Open:
		w("    ct state established,related accept")
	case netpolicy.Allow:
		for _, r := range p.Rules() {
			if r.Name != "" {
				continue
			}
			if r.Lo == 0 && r.Hi == 0 {
				w("    ip saddr %s accept", r.Prefix)
			} else {
				w("    ip saddr %s meta l4proto { tcp, udp } th sport %d-%d accept", r.Prefix, r.Lo, r.Hi)
			}
		}
	}
	w("  }")
	w("  chain forward {")
	w("    type filter hook forward priority 0; policy drop;")
	w("  }")
	w("}")
	return b.String()
}

var hostOnce sync.Mutex

// hostTable puts the host's own guard in place (once; idempotent): from
// sandboxes' veths the host accepts only the gateway's ports and replies,
// and only to the address of the veth a packet came in on (its own
// gateway), so a sandbox reaches no other host service even in mode open
// and no other sandbox's gateway; it forwards (with masquerade) what the
// sandboxes' own filters let out to addresses, and nothing between
// sandboxes.
func hostTable(ctx context.Context, ports Ports) error {
	hostOnce.Lock()
	defer hostOnce.Unlock()
	return run(ctx, []byte(hostRuleset(ports)), "nft", "-f", "-")
}

// hostRuleset is the host's table (see hostTable).
func hostRuleset(ports Ports) string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	w("add table inet tine-host")
	w("delete table inet tine-host")
	w("table inet tine-host {")
	w("  chain input {")
	w("    type filter hook input priority -10; policy accept;")
	// Only to the address of the veth it came in on: its own gateway,
	// never another sandbox's.
	w("    iifname \"%s*\" fib daddr . iif type != local counter drop", hostPrefix)
	w("    iifname \"%s*\" udp dport %d accept", hostPrefix, ports.DNS)
	w("    iifname \"%s*\" tcp dport { %s } accept", hostPrefix, ports.tcp())
	w("    iifname \"%s*\" ct state established,related accept", hostPrefix)
	w("    iifname \"%s*\" counter drop", hostPrefix)
	w("  }")
	w("  chain forward {")
	w("    type filter hook forward priority -10; policy accept;")
	w("    iifname \"%s*\" oifname \"%s*\" drop", hostPrefix, hostPrefix)
	w("    ip saddr %s ip daddr %s drop", Subnet, Subnet)
	w("    iifname \"%s*\" meta nfproto ipv6 drop", hostPrefix)
	w("  }")
	w("  chain postrouting {")
	w("    type nat hook postrouting priority 100;")
	w("    ip saddr %s oifname != \"%s*\" masquerade", Subnet, hostPrefix)
	w("  }")
	w("}")
	return b.String()
}

// EnableForwarding turns on the host's IPv4 forwarding, which mode open
// and address rules need (a host-wide setting; tine never turns it off).
func EnableForwarding() error {
	return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
}

// tcp lists the TCP ports for nftables.
func (p Ports) tcp() string {
	s := fmt.Sprintf("%d, %d, %d, %d", p.DNS, p.HTTP, p.HTTPS, p.Proxy)
	if p.API != 0 {
		s += fmt.Sprintf(", %d", p.API)
	}
	return s
}
