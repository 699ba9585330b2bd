// Package netpolicy is a sandbox's egress policy: a mode (none, allow,
// open) and, in allow mode, a list of destinations: domain names (a
// leading "*." matches any name below it), IP addresses and CIDR
// prefixes, each with an optional port or port range. It parses the list
// and answers whether a name or address at a port is allowed; the
// enforcement (packet filter, resolver, gateway) lives elsewhere.
package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Mode is how much of the network a sandbox reaches.
type Mode string

// The modes.
const (
	// None: loopback only (the default).
	None Mode = "none"
	// Allow: only the destinations of the list.
	Allow Mode = "allow"
	// Open: any IPv4 destination, without name checks.
	Open Mode = "open"
)

// MaxRules bounds the list, and MaxEntry one entry's length.
const (
	MaxRules = 1024
	MaxEntry = 300
)

// Policy is a parsed policy. The zero value (and nil) is mode none.
type Policy struct {
	Mode  Mode     `json:"mode"`
	Allow []string `json:"allow,omitempty"`
	rules []Rule
}

// Rule is one parsed entry of the list: a name pattern or an address
// prefix, and a port range (0-0: any port).
type Rule struct {
	// Name is a lower-case domain name, or "*." and one: any name below
	// it (not the name itself). Empty for address rules.
	Name string
	// Prefix is the address or CIDR of an address rule (a single address
	// is a /32).
	Prefix netip.Prefix
	// Lo and Hi bound the ports; both zero means any port.
	Lo, Hi uint16
}

// String writes the rule back in the list's syntax.
func (r Rule) String() string {
	s := r.Name
	if s == "" {
		s = r.Prefix.String()
		if r.Prefix.IsSingleIP() {
			s = r.Prefix.Addr().String()
		}
	}
	switch {
	case r.Lo == 0 && r.Hi == 0:
	case r.Lo == r.Hi:
		s += ":" + strconv.Itoa(int(r.Lo))
	default:
		s += fmt.Sprintf(":%d-%d", r.Lo, r.Hi)
	}
	return s
}

// Parse checks mode and entries and returns the policy. Mode "" is none.
// Entries are only allowed in mode allow.
func Parse(mode string, entries []string) (*Policy, error) {
	p := &Policy{Mode: Mode(mode)}
	if p.Mode == "" {
		p.Mode = None
	}
	switch p.Mode {
	case None, Open:
		if len(entries) > 0 {
			return nil, fmt.Errorf("network policy: mode %s takes no allow-list (give mode allow)", p.Mode)
		}
		return p, nil
	case Allow:
	default:
		return nil, fmt.Errorf("network policy: unknown mode %q (want none, allow or open)", mode)
	}
	if len(entries) > MaxRules {
		return nil, fmt.Errorf("network policy: %d entries, more than %d", len(entries), MaxRules)
	}
	for _, e := range entries {
		r, err := ParseRule(e)
		if err != nil {
			return nil, err
		}
		p.rules = append(p.rules, r)
		p.Allow = append(p.Allow, r.String())
	}
	return p, nil
}

// Compile parses p's fields again (after it was decoded from JSON).
func (p *Policy) Compile() (*Policy, error) {
	if p == nil {
		return Parse("", nil)
	}
	return Parse(string(p.Mode), p.Allow)
}

// Rules returns the parsed list.
func (p *Policy) Rules() []Rule {
	if p == nil {
		return nil
	}
	return p.rules
}

// GetMode returns the mode (none for nil).
func (p *Policy) GetMode() Mode {
	if p == nil || p.Mode == "" {
		return None
	}
	return p.Mode
}

// ParseRule parses one entry: NAME, *.NAME, IP or CIDR, each optionally
// followed by :PORT or :LO-HI. IPv6 destinations are refused: sandboxes
// have no IPv6.
func ParseRule(e string) (Rule, error) {
	bad := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("network policy: entry %q: %s", trunc(e), why)
	}
	if len(e) == 0 || len(e) > MaxEntry {
		return bad(fmt.Sprintf("want 1 to %d bytes", MaxEntry))
	}
	if strings.HasPrefix(e, "[") || strings.Count(e, ":") > 1 {
		return bad("IPv6 destinations are not supported (sandboxes have no IPv6)")
	}
	host, port, hasPort := strings.Cut(e, ":")
	var r Rule
	if hasPort {
		lo, hi, ok := strings.Cut(port, "-")
		if !ok {
			hi = lo
		}
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h, err2 := strconv.ParseUint(hi, 10, 16)
		if err1 != nil || err2 != nil || l == 0 || h < l {
			return bad("want a port 1-65535 or a range LO-HI after the colon")
		}
		r.Lo, r.Hi = uint16(l), uint16(h)
	}
	if pf, err := netip.ParsePrefix(host); err == nil {
		if !pf.Addr().Is4() {
			return bad("IPv6 destinations are not supported")
		}
		r.Prefix = pf.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return bad("IPv6 destinations are not supported")
		}
		r.Prefix = netip.PrefixFrom(a, 32)
		return r, nil
	}
	wild := strings.HasPrefix(host, "*.")
	n, err := NormalizeName(strings.TrimPrefix(host, "*."))
	if err != nil {
		return bad(err.Error())
	}
	if a, err := netip.ParseAddr(n); err == nil && !wild {
		// An address written as a name ("1.2.3.4.") is that address.
		r.Prefix = netip.PrefixFrom(a, 32)
		return r, nil
	}
	if wild {
		if !strings.Contains(n, ".") {
			return bad("a wildcard needs at least two labels after it (*.example.com, not *.com)")
		}
		n = "*." + n
	}
	r.Name = n
	return r, nil
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// NormalizeName returns a domain name in lower case without a trailing
// dot, or an error if it is not a valid host name (letters, digits,
// hyphens and underscores; labels of 1-63 bytes; 253 bytes at most).
func NormalizeName(s string) (string, error) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if s == "" || len(s) > 253 {
		return "", errors.New("want a host name of 1 to 253 bytes")
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 {
			return "", errors.New("each label of a host name has 1 to 63 bytes")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", errors.New("a label of a host name does not start or end with '-'")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("a host name has letters, digits, '-' and '_' only (found %q)", c)
			}
		}
	}
	return s, nil
}

// portOK says whether port is in the rule's range; port 0 asks whether
// any port is.
func (r Rule) portOK(port uint16) bool {
	return port == 0 || r.Lo == 0 && r.Hi == 0 || port >= r.Lo && port <= r.Hi
}

// matchName says whether the rule's name pattern covers name (normalized).
func (r Rule) matchName(name string) bool {
	if r.Name == "" {
		return false
	}
	if suffix, ok := strings.CutPrefix(r.Name, "*"); ok {
		return strings.HasSuffix(name, suffix) && len(name) > len(suffix)
	}
	return name == r.Name
}

// AllowName says whether a connection to host name at port is allowed
// (port 0: at some port). A name that is an IPv4 address is checked as
// one. Malformed names are not allowed.
func (p *Policy) AllowName(name string, port uint16) bool {
	switch p.GetMode() {
	case Open:
		return true
	case None:
		return false
	}
	if a, err := netip.ParseAddr(name); err == nil {
		return p.AllowIP(a, port)
	}
	n, err := NormalizeName(name)
	if err != nil {
		return false
	}
	for _, r := range p.rules {
		if r.matchName(n) && r.portOK(port) {
			return true
		}
	}
	return false
}

// AllowIP says whether a direct connection to address a at port is
// allowed (port 0: at some port). Only IPv4 is ever allowed.
func (p *Policy) AllowIP(a netip.Addr, port uint16) bool {
	a = a.Unmap()
	if !a.Is4() {
		return false
	}
	switch p.GetMode() {
	case Open:
		return true
	case None:
		return false
	}
	for _, r := range p.rules {
		if r.Name == "" && r.Prefix.Contains(a) && r.portOK(port) {
			return true
		}
	}
	return false
}
