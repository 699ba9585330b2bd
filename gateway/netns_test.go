package gateway

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// testNS is a network namespace made by a test: a process that sleeps in
// a new one.
type testNS struct {
	pid int
	cmd *exec.Cmd
}

func newNS(t *testing.T) *testNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests need root (network namespaces, veth, nftables)")
	}
	cmd := exec.Command("unshare", "--net", "sh", "-c", "ip link set lo up && echo ready && exec sleep 3600")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	if _, err := out.Read(b); err != nil {
		t.Fatalf("test namespace: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return &testNS{pid: cmd.Process.Pid, cmd: cmd}
}

// do runs fn on a thread inside the namespace: sockets fn makes stay in
// it.
func (n *testNS) do(fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", n.pid))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return err // the thread stays locked and goes away with the goroutine
	}
	runtime.UnlockOSThread()
	return ferr
}

func (n *testNS) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func (n *testNS) listen(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := n.do(func() (err error) { l, err = net.Listen(network, addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func (n *testNS) listenPacket(t *testing.T, network, addr string) net.PacketConn {
	t.Helper()
	var l net.PacketConn
	if err := n.do(func() (err error) { l, err = net.ListenPacket(network, addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// sh runs a shell command in the namespace.
func (n *testNS) sh(script string) (string, error) {
	out, err := exec.Command("nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", n.pid), "--", "sh", "-c", script).CombinedOutput()
	return string(out), err
}

var errConnRefused = unix.ECONNREFUSED
