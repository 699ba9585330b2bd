package api_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"tine/api"
	"tine/gateway"
)

// TestInsideOverHTTP: in modes allow and open a sandbox reaches its own
// API over HTTP at TINE_API_URL (tine.internal, resolved by its own
// resolver) and is answered as itself; a second sandbox allowed the whole
// sandboxes' range gets nothing from the first's listener, directly or
// through its own proxy, and cannot take the first's address (it has no
// CAP_NET_ADMIN); mode none has the socket but no URL.
func TestInsideOverHTTP(t *testing.T) {
	e := newInsideEnv(t, api.InsideOptions{})
	ctx := ctxT(t)
	for _, c := range []struct {
		name string
		net  *api.NetworkRequest
	}{
		{"a", &api.NetworkRequest{Mode: "allow", Allow: []string{"example.test"}}},
		{"b", &api.NetworkRequest{Mode: "allow", Allow: []string{gateway.Subnet.String()}}},
		{"o", &api.NetworkRequest{Mode: "open"}},
		{"n", nil},
	} {
		if _, err := e.c.Create(ctx, api.CreateRequest{Name: c.name, From: e.project, Network: c.net}); err != nil {
			t.Fatal(err)
		}
	}
	self := func(sb, script string) string {
		t.Helper()
		out := e.sh(sb, script)
		var s api.Sandbox
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("%s: %q: %v: %q", sb, script, err, out)
		}
		return s.Name
	}
	for _, sb := range []string{"a", "b", "o"} {
		env := e.sh(sb, `echo "$TINE_API_URL $TINE_API_SOCKET"`)
		if env != "http://tine.internal:7380 /run/tine/api.sock\n" {
			t.Errorf("%s: environment %q", sb, env)
		}
		if got := self(sb, `curl -sS --max-time 10 "$TINE_API_URL/v1/self"`); got != sb {
			t.Errorf("%s over HTTP is answered as %q", sb, got)
		}
	}
	// A request that names another sandbox is still answered as the
	// asker's own: the listener, not the request, says who asks.
	if code, body := e.curl("a", "http://tine.internal:7380/v1/sandboxes/b"); code != 404 && code != 403 {
		t.Errorf("a asking for b over HTTP: %d %s", code, body)
	}

	na, err := e.m.NetworkState("a")
	if err != nil {
		t.Fatal(err)
	}
	nb, err := e.m.NetworkState("b")
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://%s:7380/v1/self", na.Gateway)
	for _, c := range []struct{ what, script string }{
		{"directly", "curl -sS --max-time 5 " + url},
		{"through its proxy", fmt.Sprintf("curl -sS --max-time 5 -x http://%s:3128 %s", nb.Gateway, url)},
		{"through its proxy's CONNECT", fmt.Sprintf("curl -sS --max-time 5 -p -x http://%s:3128 %s", nb.Gateway, url)},
		{"by name through its proxy", fmt.Sprintf("curl -sS --max-time 5 -x http://%s:3128 http://tine.internal:7380/v1/self", nb.Gateway)},
	} {
		out := e.shAny("b", c.script)
		t.Logf("b %s: %q", c.what, out)
		if strings.Contains(out, `"name":"a"`) {
			t.Errorf("b reached a's API %s: %q", c.what, out)
		}
	}
	// b has no CAP_NET_ADMIN, so it cannot take a's gateway address.
	caps := e.sh("b", "grep CapEff /proc/self/status")
	f := strings.Fields(caps)
	v, err := strconv.ParseUint(f[len(f)-1], 16, 64)
	if err != nil || v&(1<<12) != 0 {
		t.Errorf("b's effective capabilities %q hold CAP_NET_ADMIN", caps)
	}
	if out := e.shAny("b", fmt.Sprintf("ip addr add %s/32 dev eth0; echo exit $?", na.Gateway)); !strings.Contains(out, "Operation not permitted") {
		t.Errorf("ip addr add in b: %q", out)
	}

	// Mode none: the socket, no URL, no name.
	if env := e.sh("n", `echo "url=$TINE_API_URL socket=$TINE_API_SOCKET"`); env != "url= socket=/run/tine/api.sock\n" {
		t.Errorf("mode none: environment %q", env)
	}
	if out := e.shAny("n", "getent hosts tine.internal; echo exit $?"); !strings.Contains(out, "exit 2") {
		t.Errorf("mode none resolves tine.internal: %q", out)
	}
	// A command that sets a variable itself keeps its own.
	req := shReq(`echo "$TINE_API_URL $TINE_API_SOCKET"`)
	req.Env = []string{"PATH=/usr/bin:/bin", "TINE_API_URL=mine"}
	if out, _, _ := e.run("a", req, nil); out != "mine /run/tine/api.sock\n" {
		t.Errorf("a command's own TINE_API_URL: %q", out)
	}
}

// shAny runs a script in a sandbox and returns its stdout and stderr,
// whatever its exit.
func (e *insideEnv) shAny(sb, script string) string {
	e.t.Helper()
	out, errs, _ := e.run(sb, shReq(script), nil)
	return out + errs
}

// curl gets url in sandbox sb and returns the status and body.
func (e *insideEnv) curl(sb, url string) (int, string) {
	e.t.Helper()
	out := e.shAny(sb, "curl -sS --max-time 10 -o /tmp/body -w '%{http_code}' "+shellQuote(url)+"; echo; cat /tmp/body")
	code, rest, _ := strings.Cut(out, "\n")
	var status int
	fmt.Sscan(code, &status)
	return status, rest
}
