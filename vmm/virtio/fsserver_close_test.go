package virtio

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestServerCloseBounded: Close returns, with an error naming the
// process, when a server process the kill does not end keeps it waiting
// (here its Wait, held by a grandchild keeping its output open; a server
// stuck in the kernel does the same): a sandbox's Stop, and the daemon's
// Close behind it, never hang on a share's server.
func TestServerCloseBounded(t *testing.T) {
	old := serverExitWait
	serverExitWait = 100 * time.Millisecond
	defer func() { serverExitWait = old }()
	dev, srv, err := socketPair(unix.SOCK_SEQPACKET, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctl, ctlSrv, err := socketPair(unix.SOCK_STREAM, "test control")
	if err != nil {
		t.Fatal(err)
	}
	defer ctlSrv.Close()
	cmd := exec.Command("sh", "-c", "sleep 30 & sleep 30")
	cmd.Stdout = &bytes.Buffer{} // a pipe the grandchild holds: Wait waits for it
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	c := &serverConn{File: dev, ctl: ctl, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(c.done)
	}()
	start := time.Now()
	err = c.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v", took)
	}
	if err == nil || !strings.Contains(err.Error(), "did not end") {
		t.Fatalf("Close: %v, want the process that did not end named", err)
	}
}
