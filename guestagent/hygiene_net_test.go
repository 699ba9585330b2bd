package guestagent

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestApplyNet gives an interface two identities in turn, as a parent
// and then its clone get them, in a network namespace of its own: after
// the second the interface has the second MAC, the second address as its
// only IPv4 one, and the default route through the second gateway.
func TestApplyNet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip(8) to make the test's interface")
	}
	errc := make(chan error, 1)
	go func() {
		// The thread stays in the new namespace and ends with the
		// goroutine (never unlocked).
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- applyNetTwice()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func applyNetTwice() error {
	for _, c := range [][]string{{"link", "add", "eth0", "type", "veth", "peer", "name", "peer0"}, {"link", "set", "peer0", "up"}} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", c, err, out)
		}
	}
	ids := []NetIdentity{
		{Interface: "eth0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, Addr: netip.MustParsePrefix("10.214.0.2/30"), Gateway: netip.MustParseAddr("10.214.0.1")},
		{Interface: "eth0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, Addr: netip.MustParsePrefix("10.214.0.6/30"), Gateway: netip.MustParseAddr("10.214.0.5")},
	}
	for _, id := range ids {
		if err := ApplyNet(id); err != nil {
			return err
		}
	}
	ifc, err := net.InterfaceByName("eth0")
	if err != nil {
		return err
	}
	if !bytes.Equal(ifc.HardwareAddr, ids[1].MAC) || ifc.Flags&net.FlagUp == 0 {
		return fmt.Errorf("eth0 has MAC %s, flags %v", ifc.HardwareAddr, ifc.Flags)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return err
	}
	var v4 []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			v4 = append(v4, n.String())
		}
	}
	if len(v4) != 1 || v4[0] != "10.214.0.6/30" {
		return fmt.Errorf("eth0's IPv4 addresses %v, want only 10.214.0.6/30", v4)
	}
	// The calling thread's routes (/proc/net is the process's namespace).
	b, err := os.ReadFile("/proc/thread-self/net/route")
	if err != nil {
		return err
	}
	// Default route: destination 0, gateway 10.214.0.5 (little-endian hex).
	if !strings.Contains(string(b), "eth0\t00000000\t0500D60A") {
		return fmt.Errorf("no default route via 10.214.0.5 on eth0:\n%s", b)
	}
	return nil
}
