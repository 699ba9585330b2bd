package gateway

import (
	"net/http"
	"strings"
	"time"
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
// upstream, and audits the swaps (auditCredential). A header that
// carries a placeholder of a secret not bound to this destination is
// removed, so that no placeholder is mistaken for a credential
// elsewhere.
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
		g.auditCredential(name, port, s)
	}
}

// credEvery is the least time between two audit records of one
// secret's use at one destination: the first use is recorded at once,
// the next ones are counted into a record credEvery after it, so that a
// sandbox sending requests as fast as it can does not grow the audit
// log at that rate. Tests shorten it.
var credEvery = 10 * time.Second

// maxCredKeys bounds the destinations whose uses are counted apart (a
// sandbox chooses names under a bound "*.host"); further ones are
// counted under otherDest.
const (
	maxCredKeys = 1024
	otherDest   = "(other names)"
)

// credKey is one secret's use at one destination.
type credKey struct {
	dest   string
	port   uint16
	secret string
	header string
}

// credUse counts the uses of a credKey.
type credUse struct {
	last    time.Time   // when its last record went out
	pending int         // uses since, not yet recorded
	timer   *time.Timer // records them once credEvery has passed
}

// auditCredential records a swap of s into a request to name:port, or
// counts it into the next record of that secret and destination.
func (g *Gateway) auditCredential(name string, port uint16, s Secret) {
	k := credKey{name, port, s.Name, s.Header}
	g.mu.Lock()
	if g.creds == nil {
		g.creds = map[credKey]*credUse{}
	}
	u := g.creds[k]
	if u == nil && len(g.creds) >= maxCredKeys {
		k.dest = otherDest
		u = g.creds[k]
	}
	if u == nil {
		u = &credUse{}
		g.creds[k] = u
	}
	u.pending++
	if wait := credEvery - time.Since(u.last); wait > 0 {
		if u.timer == nil && !g.closed {
			u.timer = time.AfterFunc(wait, func() { g.flushCredential(k) })
		}
		g.mu.Unlock()
		return
	}
	n := u.pending
	u.pending, u.last = 0, time.Now()
	g.mu.Unlock()
	g.audit("credential", credFields(k, n))
}

// flushCredential records the uses of k counted since its last record.
func (g *Gateway) flushCredential(k credKey) {
	g.mu.Lock()
	n := 0
	if u := g.creds[k]; u != nil {
		n, u.pending, u.timer = u.pending, 0, nil
		if n > 0 {
			u.last = time.Now()
		}
	}
	g.mu.Unlock()
	if n > 0 {
		g.audit("credential", credFields(k, n))
	}
}

// flushCredentials records every count not recorded yet (at Close).
func (g *Gateway) flushCredentials() {
	g.mu.Lock()
	keys := make([]credKey, 0, len(g.creds))
	for k, u := range g.creds {
		if u.timer != nil {
			u.timer.Stop()
		}
		keys = append(keys, k)
	}
	g.mu.Unlock()
	for _, k := range keys {
		g.flushCredential(k)
	}
}

// credFields is the audit record of n uses of k.
func credFields(k credKey, n int) map[string]any {
	return map[string]any{"destination": k.dest, "port": k.port, "secret": k.secret, "header": k.header, "count": n}
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
