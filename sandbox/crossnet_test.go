package sandbox_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"tine/gateway"
	"tine/sandbox"
)

// crossDial is the gateway's upstream dialer in these tests: names go to
// the test's upstream namespace, addresses of the sandboxes' range are
// dialed from the host as the default dialer dials an allowed address.
func crossDial(up *upstreamNS) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, _ := net.SplitHostPort(addr)
		if a, err := netip.ParseAddr(host); err == nil && gateway.Subnet.Contains(a) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
		return up.dial(ctx, network, addr)
	}
}

// TestSandboxesCannotUseEachOthersGateway starts two sandboxes: a, which
// may reach api.test with a secret bound to it, and b, whose allow-list
// holds the whole sandboxes' range. b must get nothing from a's gateway:
// not by connecting to a's gateway address (which would serve b under a's
// policy and put a's secret into b's request), not through its own
// proxy, and not by taking a's address.
func TestSandboxesCannotUseEachOthersGateway(t *testing.T) {
	up, upCA := newUpstream(t, nil)
	e := newEnvWith(t, sandbox.Options{Network: sandbox.NetworkOptions{Dial: crossDial(up), RootCAs: upCA.Pool()}})
	ctx := context.Background()
	const value = "a-secret-value-0123456789"
	if err := e.m.SetSecret("API_TOKEN", []byte(value)); err != nil {
		t.Fatal(err)
	}
	bind, err := sandbox.ParseSecretBinding("API_TOKEN=api.test:header:Authorization:Bearer")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "a", Dir: e.project, Network: allowPolicy(t, "api.test"),
		Secrets: []sandbox.SecretBinding{bind}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "b", Dir: e.project, Network: allowPolicy(t, gateway.Subnet.String())}); err != nil {
		t.Fatal(err)
	}
	sa, err := e.m.NetworkState("a")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := e.m.NetworkState("b")
	if err != nil {
		t.Fatal(err)
	}
	// a itself is served, with its secret.
	if out := e.mustSh("a", "curl -sS --max-time 10 https://api.test/"); !strings.Contains(out, "auth=Bearer "+value) {
		t.Fatalf("a's own request: %q", out)
	}
	agw, aaddr, bgw := sa.Gateway, sa.Address, sb.Gateway
	for _, c := range []struct{ what, script string }{
		{"a's HTTPS port", fmt.Sprintf("curl -sSk --max-time 5 --resolve api.test:443:%s https://api.test/", agw)},
		{"a's HTTP port", fmt.Sprintf("curl -sS --max-time 5 --resolve api.test:80:%s http://api.test/", agw)},
		{"a's proxy port", fmt.Sprintf("curl -sS --max-time 5 -x http://%s:3128 http://api.test/", agw)},
		{"a's proxy through b's", fmt.Sprintf(`exec 3<>/dev/tcp/%s/3128 || exit 1
printf 'CONNECT %s:3128 HTTP/1.1\r\nHost: %s:3128\r\n\r\nGET http://api.test/ HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n' >&3
timeout 5 cat <&3`, bgw, agw, agw)},
		{"a's resolver", fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/53 && echo connected'", agw)},
		{"a's address", fmt.Sprintf("curl -sS --max-time 5 http://%s/", aaddr)},
	} {
		out, _ := e.sh("b", "exec bash -c "+shellQuote(c.script))
		if strings.Contains(out, "hello api.test") || strings.Contains(out, value) || strings.Contains(out, "connected") {
			t.Errorf("b reached %s: %q", c.what, out)
		}
	}
	// b cannot take a's gateway address (it has no CAP_NET_ADMIN).
	if out, code := e.sh("b", fmt.Sprintf("ip addr add %s/32 dev eth0", agw)); code == 0 {
		t.Errorf("b added a's gateway address to its interface: %q", out)
	} else if !strings.Contains(out, "Operation not permitted") {
		t.Errorf("ip addr add: exit %d %q, want Operation not permitted", code, out)
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
