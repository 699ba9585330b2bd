package gateway

import (
	"net/http"
	"strings"
)

// Secret is a credential bound to one destination: on requests to Host
// (over HTTPS, or HTTP when Plain is set) the gateway sets Header to
// Prefix, a space and Value. The sandbox only ever holds Placeholder.
type Secret struct {
	Name        string
	Host        string // a name as in the policy list ("*.x" allowed)
	Header      string // e.g. Authorization
	Prefix      string // e.g. Bearer; may be empty
	Value       string
	Placeholder string
	// Plain allows the secret over plain HTTP too (off: HTTPS only).
	Plain bool
}

// inject swaps secrets into a request to name:port that is about to go
// upstream, and audits each swap. A header that carries a placeholder
// of a secret not bound to this destination is removed, so that no
// placeholder is mistaken for a credential elsewhere.
func (g *Gateway) inject(req *http.Request, name string, port uint16, scheme string) {
	g.mu.Lock()
	secrets := g.secrets
	g.mu.Unlock()
	bound := func(s Secret) bool {
		return s.Header != "" && s.Value != "" && matchHost(s.Host, name) && (scheme == "https" || s.Plain)
	}
	for _, s := range secrets {
		if s.Placeholder != "" && !bound(s) {
			dropCarrying(req.Header, s.Placeholder)
		}
	}
	for _, s := range secrets {
		if !bound(s) {
			continue
		}
		v := s.Value
		if s.Prefix != "" {
			v = s.Prefix + " " + v
		}
		req.Header.Set(s.Header, v)
		g.audit("credential", map[string]any{"destination": name, "port": port, "secret": s.Name, "header": s.Header})
	}
}

// dropCarrying removes from h every header with a value containing p.
func dropCarrying(h http.Header, p string) {
	for k, vv := range h {
		for _, v := range vv {
			if strings.Contains(v, p) {
				delete(h, k)
				break
			}
		}
	}
}

// matchHost says whether pattern (a name or "*.name") covers name.
func matchHost(pattern, name string) bool {
	pattern = strings.ToLower(pattern)
	if suf, ok := strings.CutPrefix(pattern, "*"); ok {
		return strings.HasSuffix(name, suf) && len(name) > len(suf)
	}
	return pattern == name
}
