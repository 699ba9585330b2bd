package vm

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestHostFilter plays the guest on a real TAP made by openNet, with
// frames written to and read from the TAP: without the host's table a
// datagram the guest sends to a host socket arrives; with it, it does
// not, while the guest's answer to a datagram the host sent it still
// does (an established flow).
func TestHostFilter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a TAP")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no /dev/net/tun: %v", err)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft")
	}
	r := &Runtime{cfg: Config{NoHostFilter: true}, nets: map[netip.Addr]bool{}}
	g, err := r.openNet()
	if err != nil {
		t.Fatal(err)
	}
	defer r.closeNet(g)
	if _, err := net.InterfaceByName(g.tap); err != nil {
		t.Fatalf("no TAP %s: %v", g.tap, err)
	}
	tap := g.dev.Backend.(*os.File)
	ifc, _ := net.InterfaceByName(g.tap)
	host, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(g.host, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	hostPort := uint16(host.LocalAddr().(*net.UDPAddr).Port)
	fromGuest := func(srcPort uint16, payload string) []byte {
		return udpFrame(g.mac, ifc.HardwareAddr, g.guest, g.host, srcPort, hostPort, payload)
	}
	got := func(want string) bool {
		host.SetReadDeadline(time.Now().Add(time.Second))
		b := make([]byte, 100)
		for {
			n, _, err := host.ReadFromUDP(b)
			if err != nil {
				return false
			}
			if string(b[:n]) == want {
				return true
			}
		}
	}

	if _, err := tap.Write(fromGuest(5000, "open")); err != nil {
		t.Fatal(err)
	}
	if !got("open") {
		t.Fatal("without the filter the host did not get the guest's datagram: the test sees nothing")
	}
	r.cfg.NoHostFilter = false
	if err := r.hostFilter(); err != nil {
		t.Fatal(err)
	}
	defer exec.Command("nft", "delete", "table", "inet", HostTable).Run()
	if _, err := tap.Write(fromGuest(5001, "filtered")); err != nil {
		t.Fatal(err)
	}
	if got("filtered") {
		t.Fatal("with the filter the guest still reached a host socket")
	}
	// The host opens a flow to the guest; the guest's answer comes in.
	if _, err := host.WriteToUDP([]byte("ping"), net.UDPAddrFromAddrPort(netip.AddrPortFrom(g.guest, 6000))); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	tap.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, err := tap.Read(buf)
		if err != nil {
			t.Fatalf("the host's datagram never reached the guest: %v", err)
		}
		f := buf[:n]
		if len(f) >= 42 && f[12] == 8 && f[13] == 6 && f[21] == 1 && bytes.Equal(f[38:42], g.guest.AsSlice()) {
			tap.Write(arpReply(g.mac, g.guest, f))
			continue
		}
		if len(f) >= 42+4 && f[12] == 8 && f[13] == 0 && f[23] == 17 && string(f[42:46]) == "ping" {
			break
		}
	}
	if _, err := tap.Write(fromGuest(6000, "pong")); err != nil {
		t.Fatal(err)
	}
	if !got("pong") {
		t.Fatal("with the filter the guest's answer to the host did not arrive")
	}
}

// udpFrame is an Ethernet frame holding an IPv4 UDP datagram (no UDP
// checksum).
func udpFrame(src, dst net.HardwareAddr, from, to netip.Addr, sport, dport uint16, payload string) []byte {
	f := append(append(append([]byte(nil), dst...), src...), 0x08, 0x00)
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	copy(ip[12:], from.AsSlice())
	copy(ip[16:], to.AsSlice())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp, sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	return append(append(append(f, ip...), udp...), payload...)
}

// arpReply answers the ARP request req for addr with mac.
func arpReply(mac net.HardwareAddr, addr netip.Addr, req []byte) []byte {
	f := append(append(append([]byte(nil), req[6:12]...), mac...), 0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2)
	f = append(f, mac...)
	f = append(f, addr.AsSlice()...)
	f = append(f, req[22:28]...) // the asker's MAC
	return append(f, req[28:32]...)
}
