package virtio

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"tine/internal/rtnl"
)

// TestNetTap puts the device in front of a real TAP whose host end has
// 10.214.255.253/30: the guest's ARP request for that address goes out
// through the TAP, and the host kernel's ARP reply comes back into a
// receive buffer, addressed to the guest's MAC.
func TestNetTap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a TAP")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no /dev/net/tun: %v", err)
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	name := fmt.Sprintf("tvt%x", rnd)
	f, err := OpenTap(name)
	if err != nil {
		t.Fatal(err)
	}
	n := &Net{MAC: testMAC, Backend: f}
	defer n.Close()
	os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0)
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rtnl.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	host, guest := netip.MustParseAddr("10.214.255.253"), netip.MustParseAddr("10.214.255.254")
	if err := c.ReplaceAddr(ifc.Index, netip.PrefixFrom(host, 30)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetUp(ifc.Index, true); err != nil {
		t.Fatal(err)
	}
	d := newTestDriver(t, n, 4<<20)
	n.Start(d.tr)
	var heads []uint16
	d.tr.mu.Lock()
	for range 8 {
		heads = append(heads, d.add(0, buf{writable: NetHeaderSize + 1514}))
	}
	d.tr.mu.Unlock()
	d.notify(0)

	arp := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	arp = append(arp, testMAC...)
	arp = append(arp, 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1)
	arp = append(arp, testMAC...)
	arp = append(arp, guest.AsSlice()...)
	arp = append(arp, 0, 0, 0, 0, 0, 0)
	arp = append(arp, host.AsSlice()...)
	d.tr.mu.Lock()
	d.add(1, buf{data: append(make([]byte, NetHeaderSize), arp...)})
	d.tr.mu.Unlock()
	d.notify(1)

	for range 8 {
		u := waitUsed(t, d, 0)
		for _, e := range u {
			b := d.descBuf(0, uint16(e[0]))[NetHeaderSize:e[1]]
			// An ARP reply (type 0x0806, op 2) to the guest's MAC from
			// the host's address.
			if len(b) >= 42 && bytes.Equal(b[:6], testMAC) && b[12] == 0x08 && b[13] == 0x06 && b[21] == 2 &&
				bytes.Equal(b[28:32], host.AsSlice()) && bytes.Equal(b[6:12], ifc.HardwareAddr) {
				return
			}
		}
	}
	t.Fatalf("no ARP reply from the host through %s", name)
}
