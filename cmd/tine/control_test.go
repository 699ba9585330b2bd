package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestControlSocketPrivate: the control socket is 0600 from the moment
// it has its name, and a connection from another user is refused by the
// peer-credential check even when the file mode would let it in.
func TestControlSocketPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect as another user")
	}
	if os.Getenv("TINE_TEST_DIAL") != "" {
		return // this process is the dialing child
	}
	root := newRoot(t)
	f, err := openRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	srv, err := serveControl(t.Context(), f, root)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		srv.close()
		srv.wg.Wait()
	}()
	p := controlPath(root)
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("control socket %s: %v, mode %v; want a 0600 socket", p, err, fi.Mode())
	}
	if ents, _ := filepath.Glob(p + ".*"); len(ents) != 0 {
		t.Errorf("temporary socket names left behind: %q", ents)
	}

	// Same user: answered.
	conn, err := net.Dial("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	json.NewEncoder(conn).Encode(controlReq{Args: []string{"ls"}})
	var resp controlResp
	json.NewDecoder(bufio.NewReader(conn)).Decode(&resp)
	conn.Close()
	if resp.Err != "" || !strings.Contains(resp.Out, "branches:") {
		t.Fatalf("own user's ls: %+v", resp)
	}

	// Another user, with the modes loosened as a careless admin might.
	for _, d := range []string{filepath.Dir(filepath.Dir(root)), filepath.Dir(root), root} {
		os.Chmod(d, 0o755)
	}
	os.Chmod(p, 0o666)
	exe := filepath.Join(t.TempDir(), "tine.test")
	copyFile(t, os.Args[0], exe)
	os.Chmod(filepath.Dir(exe), 0o755)
	cmd := exec.Command(exe, "-test.v", "-test.run=^TestControlSocketDial$")
	cmd.Env = append(os.Environ(), "TINE_TEST_DIAL="+p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "DIAL-RESULT: control socket: uid 65534 may not use the control socket") {
		t.Fatalf("another user's request was not refused:\n%s", out)
	}
}

// TestControlSocketDial is the other user's side of
// TestControlSocketPrivate; it does nothing unless that test starts it.
func TestControlSocketDial(t *testing.T) {
	p := os.Getenv("TINE_TEST_DIAL")
	if p == "" {
		return
	}
	conn, err := net.Dial("unix", p)
	if err != nil {
		t.Logf("DIAL-RESULT: dial: %v", err)
		return
	}
	defer conn.Close()
	json.NewEncoder(conn).Encode(controlReq{Args: []string{"ls"}})
	var resp controlResp
	json.NewDecoder(bufio.NewReader(conn)).Decode(&resp)
	t.Logf("DIAL-RESULT: %s%s", resp.Err, resp.Out)
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
