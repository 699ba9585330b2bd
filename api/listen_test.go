package api_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"tine/api"
)

// TestListenSocket: the socket is 0660 and in the group when the group
// exists, 0600 with a note when not; a stale socket is replaced, a live
// daemon's is not, and a file that is not a socket is left alone.
func TestListenSocket(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, api.SocketName)
	ln, err := api.Listen(root, testGroup)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := user.LookupGroup(testGroup)
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o660 || strconv.Itoa(int(st.Sys().(*syscall.Stat_t).Gid)) != g.Gid {
		t.Fatalf("socket mode %v gid %d, want 0660 and group %s (%s)", st.Mode(), st.Sys().(*syscall.Stat_t).Gid, testGroup, g.Gid)
	}
	if n := ln.(*api.Listener).Note(); n != "" {
		t.Fatalf("note with an existing group: %q", n)
	}
	go http.Serve(ln, http.NotFoundHandler())

	_, err = api.Listen(root, testGroup)
	if !errors.Is(err, api.ErrRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second Listen: %v, want ErrRunning naming pid %d", err, os.Getpid())
	}
	ln.Close()
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Fatalf("Close left the socket: %v", err)
	}

	// A socket whose daemon died: bound, never unlinked, no listener.
	dead, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	dead.SetUnlinkOnClose(false)
	dead.Close()
	ln, err = api.Listen(root, "tine-no-such-group")
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	if st, _ := os.Lstat(p); st.Mode().Perm() != 0o600 {
		t.Fatalf("socket without the group: %v, want 0600", st.Mode())
	}
	if n := ln.(*api.Listener).Note(); !strings.Contains(n, "tine-no-such-group") || !strings.Contains(n, "0600") {
		t.Fatalf("note: %q", n)
	}
	ln.Close()

	os.WriteFile(p, []byte("not a socket"), 0o644)
	if _, err := api.Listen(root, testGroup); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Listen over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "not a socket" {
		t.Fatal("Listen replaced a regular file")
	}
}

// TestPeerCheck: a user other than root and the daemon's gets no answer
// even when the socket's mode would let it connect, unless it is in the
// daemon's group. The peer is this test binary run as nobody.
func TestPeerCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a peer as another user")
	}
	dir, err := os.MkdirTemp("", "api-peer")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "peer.test")
	if err := copyFile(self, bin); err != nil {
		t.Fatal(err)
	}
	ln, err := api.Listen(dir, testGroup)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sock := filepath.Join(dir, api.SocketName)
	os.Chmod(sock, 0o666) // let the kernel pass anyone, so the peer check decides
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "answered") }))
	g, _ := user.LookupGroup(testGroup)
	gid, _ := strconv.Atoi(g.Gid)
	for _, tc := range []struct {
		groups []uint32
		want   string
	}{
		{nil, "refused"},
		{[]uint32{uint32(gid)}, "answered"},
	} {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "TINE_PEER_DIAL="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: tc.groups}}
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), "peer: "+tc.want) {
			t.Errorf("peer as nobody with groups %v: %s, want %s", tc.groups, out, tc.want)
		}
	}
}

// peerDial is the child half of TestPeerCheck: it asks the socket and
// prints what came of it.
func peerDial(sock string) {
	c := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }}}
	resp, err := c.Get("http://tine/")
	if err != nil {
		fmt.Println("peer: refused:", err)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("peer: %s\n", b)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}
