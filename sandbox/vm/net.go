package vm

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"

	"tine/gateway"
	"tine/guestagent/proto"
	"tine/internal/rtnl"
	"tine/vmm/virtio"
)

// NetSubnet is where vm sandboxes get their networks: each running
// machine (each boot, clone and restore) a /30 of its own, the host end
// of its TAP the first address, the guest the second. It is apart from
// the ns runtime's 10.213.0.0/16 (gateway.Subnet).
var NetSubnet = netip.MustParsePrefix("10.214.0.0/16")

// GuestInterface is the guest's name for its network device.
const GuestInterface = "eth0"

// tapPrefix starts every vm sandbox's TAP name ("tv" and 8 hex digits).
const tapPrefix = "tv"

// guestNet is one machine's network: its TAP on the host, the device in
// front of it, and the addresses.
type guestNet struct {
	dev     *virtio.Net
	tap     string
	mac     net.HardwareAddr
	host    netip.Addr // the TAP's address, the guest's gateway
	guest   netip.Addr
	netBase netip.Addr // the /30's network address, the allocation key
}

// hygiene is the identity the agent gives the guest's interface.
func (g *guestNet) hygiene() *proto.HygieneNet {
	return &proto.HygieneNet{Interface: GuestInterface, MAC: g.mac.String(),
		Address: netip.PrefixFrom(g.guest, 30).String(), Gateway: g.host.String()}
}

// openNet gives a new machine a network: a free /30 in NetSubnet (none
// this runtime gave out, none on a host interface), a TAP named
// tvXXXXXXXX holding the /30's first address, up, without IPv6, and a
// random locally administered unicast MAC for the guest.
func (r *Runtime) openNet() (*guestNet, error) {
	r.netMu.Lock()
	defer r.netMu.Unlock()
	base, err := r.freeNet()
	if err != nil {
		return nil, err
	}
	var rnd [10]byte
	rand.Read(rnd[:])
	g := &guestNet{tap: fmt.Sprintf("%s%08x", tapPrefix, binary.BigEndian.Uint32(rnd[:4])), netBase: base,
		host: base.Next(), guest: base.Next().Next()}
	g.mac = net.HardwareAddr(rnd[4:10])
	g.mac[0] = g.mac[0]&^1 | 2 // unicast, locally administered
	f, err := virtio.OpenTap(g.tap)
	if err != nil {
		return nil, fmt.Errorf("vm runtime: network: %w", err)
	}
	if err := configureTap(g.tap, netip.PrefixFrom(g.host, 30)); err != nil {
		f.Close()
		return nil, fmt.Errorf("vm runtime: network: %w", err)
	}
	if err := r.hostFilter(); err != nil {
		f.Close()
		return nil, err
	}
	g.dev = &virtio.Net{MAC: g.mac, Backend: f}
	r.nets[base] = true
	return g, nil
}

// closeNet closes the TAP (it goes away with its file) and frees the
// /30.
func (r *Runtime) closeNet(g *guestNet) {
	g.dev.Close()
	r.netMu.Lock()
	delete(r.nets, g.netBase)
	r.netMu.Unlock()
}

// configureTap turns IPv6 off on the TAP (no router solicitations or
// neighbour discovery from the host into the guest), gives it addr and
// brings it up.
func configureTap(name string, addr netip.Prefix) error {
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("TAP %s: disable IPv6: %w", name, err)
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("TAP %s: %w", name, err)
	}
	c, err := rtnl.Dial()
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.ReplaceAddr(ifc.Index, addr); err != nil {
		return fmt.Errorf("TAP %s: %w", name, err)
	}
	if err := c.SetUp(ifc.Index, true); err != nil {
		return fmt.Errorf("TAP %s: %w", name, err)
	}
	return nil
}

// freeNet returns the network address of a /30 in NetSubnet that this
// runtime did not give out and no host interface uses, from a random
// start. r.netMu held.
func (r *Runtime) freeNet() (netip.Addr, error) {
	a, err := gateway.FreeSlash30(NetSubnet, func(a netip.Addr) bool { return r.nets[a] })
	if err != nil {
		return a, fmt.Errorf("vm runtime: %w for a machine's network (stop some vm sandboxes)", err)
	}
	return a, nil
}

// HostTable is the host's nftables table for vm networks (family inet).
const HostTable = "tine-vm"

// hostRuleset keeps guests to their own link: a guest cannot open a
// connection to any address of the host (only answer one the host
// opened to it), and nothing is forwarded from or to a vm TAP, so no
// guest reaches another guest, an ns sandbox, or beyond the host. ARP
// is not IP, so the link still resolves.
func hostRuleset() string {
	var b bytes.Buffer
	w := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	w("add table inet %s", HostTable)
	w("delete table inet %s", HostTable)
	w("table inet %s {", HostTable)
	w("  chain input {")
	w("    type filter hook input priority -10; policy accept;")
	w("    iifname \"%s*\" ct state established,related accept", tapPrefix)
	w("    iifname \"%s*\" counter drop", tapPrefix)
	w("  }")
	w("  chain forward {")
	w("    type filter hook forward priority -10; policy accept;")
	w("    iifname \"%s*\" counter drop", tapPrefix)
	w("    oifname \"%s*\" counter drop", tapPrefix)
	w("  }")
	w("}")
	return b.String()
}

// hostFilter installs the host's table (hostRuleset) before the first
// TAP of this runtime comes up, unless Config.NoHostFilter. r.netMu held.
func (r *Runtime) hostFilter() error {
	if r.cfg.NoHostFilter || r.filtered {
		return nil
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("vm runtime: network: the host filter for vm networks needs nft (install nftables): %w", err)
	}
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = bytes.NewBufferString(hostRuleset())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("vm runtime: network: install the host's table inet %s: %w: %s", HostTable, err, bytes.TrimSpace(out))
	}
	r.filtered = true
	return nil
}
