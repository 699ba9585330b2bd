package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tine/api"
	"tine/api/client"
)

// TestDaemonSocketPrivate: the daemon's socket (which replaced the
// mounting process's control socket) is 0600 from the moment it has its
// name, and a connection from another user is refused by the
// peer-credential check even when the file mode would let it in.
func TestDaemonSocketPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as another user")
	}
	if os.Getenv("TINE_TEST_DIAL") != "" {
		return // this process is the dialing child
	}
	root := newRoot(t)
	stop := serveInProcess(t, root)
	defer stop()
	p := filepath.Join(root, api.SocketName)
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("daemon socket %s: %v, mode %v; want a 0600 socket", p, err, fi.Mode())
	}
	if ents, _ := filepath.Glob(p + ".*tmp*"); len(ents) != 0 {
		t.Errorf("temporary socket names left behind: %q", ents)
	}

	// Same user: answered.
	out, errOut, code := tine(t, "fs", "ls", "--root", root)
	if code != 0 || !strings.Contains(out, "branches:") {
		t.Fatalf("own user's fs ls: exit %d, %q, %q", code, out, errOut)
	}

	// Another user, with the modes loosened as a careless admin might.
	for _, d := range []string{filepath.Dir(filepath.Dir(root)), filepath.Dir(root), root} {
		os.Chmod(d, 0o755)
	}
	os.Chmod(p, 0o666)
	exe := filepath.Join(t.TempDir(), "tine.test")
	copyFile(t, os.Args[0], exe)
	os.Chmod(filepath.Dir(exe), 0o755)
	cmd := exec.Command(exe, "-test.v", "-test.run=^TestDaemonSocketDial$")
	cmd.Env = append(os.Environ(), "TINE_TEST_DIAL="+p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	dial, _ := cmd.CombinedOutput()
	if !strings.Contains(string(dial), "DIAL-RESULT: refused") {
		t.Fatalf("another user's request was not refused:\n%s", dial)
	}
}

// TestDaemonSocketDial is the other user's side of
// TestDaemonSocketPrivate; it does nothing unless that test starts it.
func TestDaemonSocketDial(t *testing.T) {
	p := os.Getenv("TINE_TEST_DIAL")
	if p == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client.New(p).FS(ctx, "ls", api.FSRequest{})
	if err != nil {
		t.Logf("DIAL-RESULT: refused: %v", err)
		return
	}
	t.Logf("DIAL-RESULT: answered: %s", resp.Output)
}

// serveInProcess runs "tine serve" for root in this process until the
// returned function is called, which waits for it to end and checks that
// it removed its socket.
func serveInProcess(t *testing.T, root string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var errOut bytes.Buffer
	go func() {
		defer close(done)
		var out bytes.Buffer
		if code := runContext(ctx, []string{"serve", "--root", root}, &out, &errOut); code != 0 {
			t.Errorf("serve: exit %d: %s", code, errOut.String())
		}
	}()
	cl := client.New(filepath.Join(root, api.SocketName))
	for deadline := time.Now().Add(20 * time.Second); cl.Ping(ctx) != nil; {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("the daemon did not answer: %s", errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() {
		cancel()
		<-done
		if _, err := os.Stat(filepath.Join(root, api.SocketName)); !os.IsNotExist(err) {
			t.Errorf("daemon socket left behind (%v)", err)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
