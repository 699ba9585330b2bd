package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	p, err := Parse("allow", []string{"registry.npmjs.org", "*.github.com:443", "10.1.0.0/16:80-90", "192.0.2.7", "Example.COM."})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		port uint16
		want bool
	}{
		{"registry.npmjs.org", 443, true},
		{"REGISTRY.npmjs.org.", 80, true},
		{"npmjs.org", 443, false},
		{"evil-registry.npmjs.org", 443, false},
		{"api.github.com", 443, true},
		{"a.b.github.com", 443, true},
		{"api.github.com", 80, false},
		{"github.com", 443, false},
		{"xgithub.com", 443, false},
		{"api.github.com", 0, true},
		{"example.com", 1, true},
		{"10.1.2.3", 85, true}, // a name that is an address is checked as one
		{"10.1.2.3", 443, false},
		{"", 80, false},
		{"bad..name", 80, false},
	} {
		if got := p.AllowName(c.name, c.port); got != c.want {
			t.Errorf("AllowName(%q, %d) = %v, want %v", c.name, c.port, got, c.want)
		}
	}
	for _, c := range []struct {
		ip   string
		port uint16
		want bool
	}{
		{"10.1.255.255", 80, true},
		{"10.2.0.1", 80, false},
		{"10.1.0.1", 91, false},
		{"192.0.2.7", 22, true},
		{"192.0.2.8", 22, false},
		{"::ffff:192.0.2.7", 22, true},
		{"2001:db8::1", 22, false},
	} {
		if got := p.AllowIP(netip.MustParseAddr(c.ip), c.port); got != c.want {
			t.Errorf("AllowIP(%s, %d) = %v, want %v", c.ip, c.port, got, c.want)
		}
	}
	if got := strings.Join(p.Allow, " "); got != "registry.npmjs.org *.github.com:443 10.1.0.0/16:80-90 192.0.2.7 example.com" {
		t.Errorf("normalized list: %s", got)
	}
}

func TestModes(t *testing.T) {
	var nilp *Policy
	if nilp.AllowName("a.com", 80) || nilp.GetMode() != None {
		t.Error("nil policy must be mode none")
	}
	open, _ := Parse("open", nil)
	if !open.AllowName("anything.example", 1) || open.AllowIP(netip.MustParseAddr("::1"), 1) {
		t.Error("open allows every IPv4 destination and no IPv6")
	}
	for _, c := range []struct {
		mode    string
		entries []string
	}{
		{"none", []string{"a.com"}},
		{"open", []string{"a.com"}},
		{"closed", nil},
		{"allow", []string{"*.com"}},
		{"allow", []string{"a.com:0"}},
		{"allow", []string{"a.com:70000"}},
		{"allow", []string{"a.com:90-80"}},
		{"allow", []string{"[::1]:80"}},
		{"allow", []string{"2001:db8::/32"}},
		{"allow", []string{"a b.com"}},
		{"allow", []string{"-a.com"}},
		{"allow", []string{""}},
	} {
		if _, err := Parse(c.mode, c.entries); err == nil {
			t.Errorf("Parse(%q, %q) succeeded", c.mode, c.entries)
		}
	}
}

// FuzzParseRule checks that any entry either fails to parse or parses to
// a rule that writes back to an entry parsing to the same rule, and that
// matching never panics.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"a.com", "*.npmjs.org:443", "10.0.0.0/8:1-100", "1.2.3.4", "[::1]:80", "a.com:", "*.", "x:1-"} {
		f.Add(s, "sub.npmjs.org", uint16(443))
	}
	f.Fuzz(func(t *testing.T, entry, name string, port uint16) {
		r, err := ParseRule(entry)
		if err != nil {
			return
		}
		r2, err := ParseRule(r.String())
		if err != nil || r2 != r {
			t.Fatalf("%q -> %q -> %v %v", entry, r.String(), r2, err)
		}
		p := &Policy{Mode: Allow, rules: []Rule{r}}
		p.AllowName(name, port)
		if a, err := netip.ParseAddr(name); err == nil {
			p.AllowIP(a, port)
		}
	})
}

// TestAddressWrittenAsName: an IPv4 address with a trailing dot is that
// address, as a rule and when written back (the fuzzer found it parsed as
// a name that wrote back as an address).
func TestAddressWrittenAsName(t *testing.T) {
	r, err := ParseRule("1.2.3.4.:443")
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "" || r.Prefix != netip.MustParsePrefix("1.2.3.4/32") || r.Lo != 443 || r.Hi != 443 {
		t.Fatalf("1.2.3.4.:443 parsed as %+v, want the address 1.2.3.4/32 port 443", r)
	}
	if r2, err := ParseRule(r.String()); err != nil || r2 != r {
		t.Fatalf("written back as %q: %+v %v", r.String(), r2, err)
	}
}
