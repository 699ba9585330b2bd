package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"tine/api"
	"tine/api/client"
)

// farNS is a network namespace made by the test that stands for a remote
// network: a veth from the host (not one of tine's) with address
// 198.18.N.2 on its end, reached through the host's routing as a server
// on the internet would be.
type farNS struct {
	pid  int
	addr string // its address
	net  string // its /30
}

func newFarNS(t *testing.T) *farNS {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "sh", "-c", "ip link set lo up && echo ready && exec sleep 3600")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := out.Read(make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var b [2]byte
	rand.Read(b[:])
	n := int(b[0]) % 250
	host := "tu" + hex.EncodeToString(b[:])
	f := &farNS{pid: cmd.Process.Pid, addr: fmt.Sprintf("198.18.%d.2", n), net: fmt.Sprintf("198.18.%d.0/30", n)}
	pid := fmt.Sprint(f.pid)
	for _, argv := range [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", pid},
		{"ip", "addr", "add", fmt.Sprintf("198.18.%d.1/30", n), "dev", host},
		{"ip", "link", "set", host, "up"},
		{"nsenter", "--net=/proc/" + pid + "/ns/net", "ip", "addr", "add", f.addr + "/30", "dev", "eth0"},
		{"nsenter", "--net=/proc/" + pid + "/ns/net", "ip", "link", "set", "eth0", "up"},
		{"nsenter", "--net=/proc/" + pid + "/ns/net", "ip", "route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", n)},
	} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", argv, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	return f
}

// serve answers HTTP on the namespace's address at port with a line that
// names the port.
func (f *farNS) serve(t *testing.T, port int) {
	t.Helper()
	var ln net.Listener
	err := inNetNS(f.pid, func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", f.addr, port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "far %d\n", port)
	}))
}

// inNetNS runs fn on a thread in the network namespace of pid.
func inNetNS(pid int, fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
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
		return err // the thread stays locked and ends with the goroutine
	}
	runtime.UnlockOSThread()
	return ferr
}

// newSandboxCLI is a state root with an autostarted daemon stopped at the
// end of the test, and a project directory.
func newSandboxCLI(t *testing.T) (cli, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("sandboxes need /dev/fuse")
	}
	for _, p := range []string{"curl", "nft", "ip", "unshare", "nsenter"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is needed (make deps)", p)
		}
	}
	base := t.TempDir()
	c := cli{t: t, root: filepath.Join(base, "root")}
	c.ok("init")
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(c.root, api.SocketName)); err == nil {
			c.stopDaemon()
		}
	})
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "hello.txt"), []byte("hello\n"), 0o644)
	return c, proj
}

// fetch runs curl in sandbox sb and says whether url answered want.
func (c cli) fetch(sb, url, want string) (bool, string) {
	c.t.Helper()
	out, errOut, code := c.run("", "exec", sb, "--", "curl", "-sS", "--max-time", "5", url)
	return code == 0 && strings.Contains(out, want), fmt.Sprintf("exit %d: %s%s", code, out, errOut)
}

// TestNetworkCLI drives network policies through the CLI and the API
// with real traffic to a namespace standing for a remote network: mode
// open reaches it; an address rule and a CIDR rule with a port let
// through exactly what they list; --allow and --deny change a running
// sandbox's list at once; --set none cuts it off; bad input is a usage
// error.
func TestNetworkCLI(t *testing.T) {
	c, proj := newSandboxCLI(t)
	far := newFarNS(t)
	far.serve(t, 8080)
	far.serve(t, 8081)
	u80, u81 := "http://"+far.addr+":8080/", "http://"+far.addr+":8081/"

	// Bad input: usage errors, nothing created.
	if _, errOut, code := c.run("", "create", "--from", proj, "--name", "bad", "--network", "bogus"); code != 2 || !strings.Contains(errOut, "bogus") {
		t.Errorf("--network bogus: exit %d, %s", code, errOut)
	}
	if _, errOut, code := c.run("", "create", "--from", proj, "--name", "bad", "--network", "open", "--allow", "x.test"); code != 2 || !strings.Contains(errOut, "allow") {
		t.Errorf("--network open --allow: exit %d, %s", code, errOut)
	}
	if _, errOut, code := c.run("", "create", "--from", proj, "--name", "bad", "--allow", "2001:db8::1"); code != 2 || !strings.Contains(errOut, "IPv6") {
		t.Errorf("--allow IPv6: exit %d, %s", code, errOut)
	}

	// Mode open: loud, and reaches the far network on any port.
	_, errOut, code := c.run("", "create", "--from", proj, "--name", "n", "--network", "open")
	if code != 0 || !strings.Contains(errOut, "any IPv4 address") {
		t.Fatalf("create --network open: exit %d, %s", code, errOut)
	}
	for _, u := range []string{u80, u81} {
		if ok, out := c.fetch("n", u, "far"); !ok {
			t.Errorf("mode open: %s: %s", u, out)
		}
	}
	var st api.Network
	if err := json.Unmarshal([]byte(c.ok("network", "n", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Policy.GetMode() != "open" || st.Gateway == "" || st.Address == "" {
		t.Errorf("network --json in mode open: %+v", st)
	}
	// Even mode open does not reach the host's own services.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go http.Serve(hostLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "host service") }))
	hostPort := hostLn.Addr().(*net.TCPAddr).Port
	if ok, out := c.fetch("n", fmt.Sprintf("http://%s:%d/", st.Gateway, hostPort), "host service"); ok {
		t.Errorf("mode open reached a host service on the gateway's address: %s", out)
	}

	// A CIDR rule with a port: that port only.
	text := c.ok("network", "n", "--set", "allow", "--allow", far.net+":8080")
	if !strings.Contains(text, "mode     allow") || !strings.Contains(text, far.net+":8080") {
		t.Errorf("network --set allow: %s", text)
	}
	if ok, out := c.fetch("n", u80, "far 8080"); !ok {
		t.Errorf("CIDR rule: its port: %s", out)
	}
	if ok, out := c.fetch("n", u81, "far"); ok {
		t.Errorf("CIDR rule: another port got through: %s", out)
	}
	// An address rule added to the running sandbox's list.
	c.ok("network", "n", "--allow", far.addr+":8081")
	if ok, out := c.fetch("n", u81, "far 8081"); !ok {
		t.Errorf("address rule added: %s", out)
	}
	c.ok("network", "n", "--deny", far.net+":8080")
	if ok, out := c.fetch("n", u80, "far"); ok {
		t.Errorf("after --deny of the CIDR rule, 8080 still answers: %s", out)
	}
	if ok, out := c.fetch("n", u81, "far 8081"); !ok {
		t.Errorf("after --deny of another rule, the address rule stopped working: %s", out)
	}
	if _, errOut, code := c.run("", "network", "n", "--deny", "192.0.2.9"); code != 2 || !strings.Contains(errOut, "not in the allow-list") {
		t.Errorf("--deny of an entry not listed: exit %d, %s", code, errOut)
	}
	if _, errOut, code := c.run("", "network", "n", "--set", "open", "--deny", far.addr); code != 2 {
		t.Errorf("--set with --deny: exit %d, %s", code, errOut)
	}

	// The API, as a program would use it.
	cl := client.New(filepath.Join(c.root, api.SocketName))
	ctx := context.Background()
	got, err := cl.SetNetwork(ctx, "n", api.NetworkRequest{Mode: "allow", Allow: []string{far.addr}})
	if err != nil || got.Policy.GetMode() != "allow" || len(got.Policy.Allow) != 1 || got.Policy.Allow[0] != far.addr {
		t.Errorf("API: set network: %+v, %v", got, err)
	}
	if ok, out := c.fetch("n", u80, "far 8080"); !ok {
		t.Errorf("API: address rule without a port: %s", out)
	}
	var ce *client.Error
	if _, err := cl.SetNetwork(ctx, "n", api.NetworkRequest{Add: []string{"*"}}); !errors.As(err, &ce) || ce.Code != "bad_request" {
		t.Errorf("API: a bad entry: %v", err)
	}
	if _, err := cl.Network(ctx, "nosuch"); !errors.As(err, &ce) || ce.Code != "not_found" {
		t.Errorf("API: network of a sandbox that does not exist: %v", err)
	}

	// Mode none: cut off.
	c.ok("network", "n", "--set", "none")
	if ok, out := c.fetch("n", u80, "far"); ok {
		t.Errorf("mode none: %s", out)
	}
	var none api.Network
	if err := json.Unmarshal([]byte(c.ok("network", "n", "--json")), &none); err != nil || none.Policy.GetMode() != "none" || none.Gateway != "" {
		t.Errorf("network --json in mode none: %+v, %v", none, err)
	}
	// The daemon's audit lines record the policy changes.
	if log := logTail(filepath.Join(c.root, daemonLog), 0, 400); !strings.Contains(log, `"kind":"network.policy"`) {
		t.Errorf("no policy change in the daemon's audit lines:\n%s", log)
	}
}

// TestSecretCLI stores a secret through the CLI and binds it: the file is
// 0600 in the state root, ls shows no value, a binding to a destination
// the policy does not allow is a usage error, the sandbox sees the
// placeholder, the daemon's log never holds the value, rm deletes it.
func TestSecretCLI(t *testing.T) {
	c, proj := newSandboxCLI(t)
	var rb [8]byte
	rand.Read(rb[:])
	value := "v-" + hex.EncodeToString(rb[:])
	t.Setenv("TEST_TOKEN_SOURCE", value)
	if _, errOut, code := c.run("", "secret", "set", "TOK"); code != 2 || !strings.Contains(errOut, "--from-env") {
		t.Errorf("secret set without a source: exit %d, %s", code, errOut)
	}
	c.ok("secret", "set", "TOK", "--from-env", "TEST_TOKEN_SOURCE")
	if st, err := os.Stat(filepath.Join(c.root, "secrets", "TOK")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("secret file: %v %v", st, err)
	}
	ls := c.ok("secret", "ls", "--json")
	if !strings.Contains(ls, `"name": "TOK"`) || strings.Contains(ls, value) {
		t.Errorf("secret ls --json: %s", ls)
	}
	bind := "TOK=api.example.test:header:Authorization:Bearer"
	if _, errOut, code := c.run("", "create", "--from", proj, "--name", "s", "--secret", bind); code != 2 || !strings.Contains(errOut, "--allow api.example.test") {
		t.Errorf("binding without the destination allowed: exit %d, %s", code, errOut)
	}
	if _, errOut, code := c.run("", "create", "--from", proj, "--name", "s", "--secret", "TOK=api.example.test"); code != 2 {
		t.Errorf("a malformed binding: exit %d, %s", code, errOut)
	}
	c.ok("create", "--from", proj, "--name", "s", "--allow", "api.example.test", "--secret", bind)
	if out := c.ok("exec", "s", "--", "sh", "-c", "echo $TOK"); out != "tine-secret-placeholder-TOK\n" {
		t.Errorf("the sandbox's variable: %q", out)
	}
	c.ok("secret", "rm", "TOK")
	if _, _, code := c.run("", "secret", "rm", "TOK"); code == 0 {
		t.Error("removing a removed secret succeeded")
	}
	if log, _ := os.ReadFile(filepath.Join(c.root, daemonLog)); strings.Contains(string(log), value) {
		t.Error("the daemon's log holds the secret")
	}
}
