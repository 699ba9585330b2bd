package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"tine/gateway"
	"tine/netpolicy"
)

// Secrets are held by the daemon in the state root (secrets/NAME, mode
// 0600, in a 0700 directory), never in a sandbox's directory or layer. A
// sandbox bound to a secret sees only its placeholder; its gateway sets
// the value on requests to the bound destination.

// MaxSecretBytes bounds a secret's value.
const MaxSecretBytes = 16 << 10

// PlaceholderPrefix starts the placeholder a sandbox sees in place of a
// secret: PlaceholderPrefix + NAME.
const PlaceholderPrefix = "tine-secret-placeholder-"

var secretNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`) })

// ErrNoSecret is returned for a secret that is not set.
var ErrNoSecret = errors.New("no such secret")

// ErrBinding is returned for a secret binding that cannot be used.
var ErrBinding = errors.New("secret binding refused")

// SecretInfo describes a stored secret (never its value).
type SecretInfo struct {
	Name    string    `json:"name"`
	Size    int       `json:"size"`
	Updated time.Time `json:"updated"`
}

// SecretBinding binds a secret to a destination: on HTTPS requests to
// Host the gateway sets Header to Prefix, a space and the value.
type SecretBinding struct {
	Name   string `json:"name"`
	Host   string `json:"host"` // a name or *.name
	Header string `json:"header"`
	Prefix string `json:"prefix,omitempty"`
}

// String writes b back in the syntax ParseSecretBinding reads.
func (b SecretBinding) String() string {
	s := b.Name + "=" + b.Host + ":header:" + b.Header
	if b.Prefix != "" {
		s += ":" + b.Prefix
	}
	return s
}

// Placeholder is what the sandbox sees in place of the secret.
func (b SecretBinding) Placeholder() string { return PlaceholderPrefix + b.Name }

var headerRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]{1,64}$`) })

// ParseSecretBinding parses NAME=HOST:header:HEADER[:PREFIX], such as
// GITHUB_TOKEN=api.github.com:header:Authorization:Bearer.
func ParseSecretBinding(s string) (SecretBinding, error) {
	bad := func(why string) (SecretBinding, error) {
		return SecretBinding{}, fmt.Errorf("secret binding %q: %s (want NAME=HOST:header:HEADER[:PREFIX], e.g. GITHUB_TOKEN=api.github.com:header:Authorization:Bearer)", trunc(s, 80), why)
	}
	name, rest, ok := strings.Cut(s, "=")
	if !ok {
		return bad("no =")
	}
	f := strings.SplitN(rest, ":", 4)
	if len(f) < 3 || f[1] != "header" {
		return bad("no :header:")
	}
	b := SecretBinding{Name: name, Host: f[0], Header: f[2]}
	if len(f) == 4 {
		b.Prefix = f[3]
	}
	return b, b.check()
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func (b SecretBinding) check() error {
	if !secretNameRE().MatchString(b.Name) {
		return fmt.Errorf("secret name %q: want a letter or _, then letters, digits or _ (at most 64)", trunc(b.Name, 80))
	}
	host, wild := strings.CutPrefix(b.Host, "*.")
	n, err := netpolicy.NormalizeName(host)
	if err != nil || strings.Contains(host, "*") {
		return fmt.Errorf("secret %s: destination %q is not a domain name", b.Name, trunc(b.Host, 80))
	}
	if wild {
		n = "*." + n
	}
	if n != b.Host {
		return fmt.Errorf("secret %s: write the destination %q as %q", b.Name, b.Host, n)
	}
	if !headerRE().MatchString(b.Header) {
		return fmt.Errorf("secret %s: header %q is not a header name", b.Name, trunc(b.Header, 80))
	}
	for _, c := range b.Prefix {
		if c < 0x21 || c == 0x7f || len(b.Prefix) > 64 {
			return fmt.Errorf("secret %s: prefix %q: want at most 64 printable characters without spaces", b.Name, trunc(b.Prefix, 80))
		}
	}
	return nil
}

// allowedBy says whether policy p lets the sandbox reach b's destination
// over HTTPS.
func (b SecretBinding) allowedBy(p *netpolicy.Policy) bool {
	if p.GetMode() == netpolicy.Open {
		return false // no name checks, so no TLS termination to swap in
	}
	if strings.HasPrefix(b.Host, "*.") {
		for _, r := range p.Rules() {
			if r.Name == b.Host && (r.Lo == 0 && r.Hi == 0 || r.Lo <= 443 && 443 <= r.Hi) {
				return true
			}
		}
		return false
	}
	return p.AllowName(b.Host, 443)
}

func (m *Manager) secretDir() string             { return filepath.Join(m.root, "secrets") }
func (m *Manager) secretFile(name string) string { return filepath.Join(m.secretDir(), name) }
func (m *Manager) bindingsFile(sandbox string) string {
	return filepath.Join(m.dir(sandbox), "secrets.json")
}

// CheckSecretValue says whether v can be a secret: not empty, at most
// MaxSecretBytes, without control characters (it goes into a header).
func CheckSecretValue(name string, v []byte) error {
	if len(v) == 0 {
		return fmt.Errorf("secret %s: the value is empty", name)
	}
	if len(v) > MaxSecretBytes {
		return fmt.Errorf("secret %s: the value has %d bytes, more than %d", name, len(v), MaxSecretBytes)
	}
	for _, c := range v {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("secret %s: the value has control characters (a newline?); it must fit in one header", name)
		}
	}
	return nil
}

// SetSecret stores (or replaces) a secret; running sandboxes bound to it
// use the new value at once.
func (m *Manager) SetSecret(name string, value []byte) error {
	if !secretNameRE().MatchString(name) {
		return fmt.Errorf("secret name %q: want a letter or _, then letters, digits or _ (at most 64)", trunc(name, 80))
	}
	if err := CheckSecretValue(name, value); err != nil {
		return err
	}
	if err := os.MkdirAll(m.secretDir(), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(m.secretDir(), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(m.secretDir(), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(value)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), m.secretFile(name))
	}
	if err != nil {
		return fmt.Errorf("store secret %s: %w", name, err)
	}
	m.refreshSecrets()
	return nil
}

// RemoveSecret deletes a secret; bound sandboxes stop getting it.
func (m *Manager) RemoveSecret(name string) error {
	if !secretNameRE().MatchString(name) {
		return fmt.Errorf("secret %q: %w", trunc(name, 80), ErrNoSecret)
	}
	if err := os.Remove(m.secretFile(name)); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("secret %s: %w", name, ErrNoSecret)
	} else if err != nil {
		return err
	}
	m.refreshSecrets()
	return nil
}

// Secrets lists the stored secrets, without their values.
func (m *Manager) Secrets() ([]SecretInfo, error) {
	ents, err := os.ReadDir(m.secretDir())
	if errors.Is(err, os.ErrNotExist) {
		return []SecretInfo{}, nil
	} else if err != nil {
		return nil, err
	}
	out := []SecretInfo{}
	for _, e := range ents {
		if !secretNameRE().MatchString(e.Name()) {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			out = append(out, SecretInfo{Name: e.Name(), Size: int(fi.Size()), Updated: fi.ModTime().UTC()})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (m *Manager) secretValue(name string) ([]byte, error) {
	b, err := os.ReadFile(m.secretFile(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("secret %s: %w; set it with \"tine secret set %s --from-env VAR\"", name, ErrNoSecret, name)
	}
	return b, err
}

// SecretBindings returns a sandbox's bindings.
func (m *Manager) SecretBindings(name string) ([]SecretBinding, error) {
	var bs []SecretBinding
	if err := readJSON(m.bindingsFile(name), &bs); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %q: secret bindings: %w", name, err)
	}
	return bs, nil
}

// initSecrets records a new sandbox's bindings (given, or a fork's
// parent's), checks each secret exists and its destination is allowed,
// and puts the placeholders in its environment.
func (m *Manager) initSecrets(info *Info, bs []SecretBinding, forkedFrom string) error {
	if bs == nil && forkedFrom != "" {
		var err error
		if bs, err = m.SecretBindings(forkedFrom); err != nil {
			return err
		}
		if len(bs) > 0 {
			return writeJSON(m.bindingsFile(info.Name), bs)
		}
		return nil // the fork's environment came with its parent's snapshot
	}
	if len(bs) == 0 {
		return nil
	}
	p, err := m.Network(info.Name)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, b := range bs {
		if err := b.check(); err != nil {
			return fmt.Errorf("%w: %w", ErrBinding, err)
		}
		if seen[b.Name] {
			return fmt.Errorf("%w: secret %s is bound twice", ErrBinding, b.Name)
		}
		seen[b.Name] = true
		if _, err := m.secretValue(b.Name); err != nil {
			return err
		}
		if !b.allowedBy(p) {
			return fmt.Errorf("%w: secret %s is bound to %s, which the network policy (mode %s) does not allow over HTTPS; add --network allow --allow %s",
				ErrBinding, b.Name, b.Host, p.GetMode(), b.Host)
		}
	}
	if len(info.Env) == 0 {
		info.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	for _, b := range bs {
		info.Env = append(info.Env, b.Name+"="+b.Placeholder())
	}
	return writeJSON(m.bindingsFile(info.Name), bs)
}

// boundSecrets returns the secrets bound to a sandbox's destinations,
// with their values; a secret removed since is left out.
func (m *Manager) boundSecrets(name string) []gateway.Secret {
	bs, _ := m.SecretBindings(name)
	var out []gateway.Secret
	for _, b := range bs {
		v, err := m.secretValue(b.Name)
		if err != nil {
			continue
		}
		out = append(out, gateway.Secret{Name: b.Name, Host: b.Host, Header: b.Header, Prefix: b.Prefix,
			Value: string(v), Placeholder: b.Placeholder()})
	}
	return out
}

// refreshSecrets gives every running gateway its sandbox's secrets as
// they are now.
func (m *Manager) refreshSecrets() {
	m.net.mu.Lock()
	live := make(map[string]*sandboxNet, len(m.net.live))
	for n, sn := range m.net.live {
		live[n] = sn
	}
	m.net.mu.Unlock()
	for n, sn := range live {
		sn.gw.SetSecrets(m.boundSecrets(n))
	}
}
