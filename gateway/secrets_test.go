package gateway

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

type memAudit struct {
	mu  sync.Mutex
	log []string
}

func (a *memAudit) Append(kind string, f map[string]any) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b strings.Builder
	b.WriteString(kind)
	for k, v := range f {
		b.WriteString(" " + k + "=")
		b.WriteString(strings.ReplaceAll(strings.TrimSpace(strings.ReplaceAll(toString(v), "\n", " ")), " ", "_"))
	}
	a.log = append(a.log, b.String())
	return nil
}

func toString(v any) string { return strings.Join(strings.Fields(fmt.Sprint(v)), " ") }

// TestSecretSwap: a request to the bound destination over HTTPS carries
// the real value in place of the placeholder; plain HTTP and other names
// do not; the audit record names the secret, never its value.
func TestSecretSwap(t *testing.T) {
	w := newWorld(t, policy(t, "api.test", "other.test"))
	a := &memAudit{}
	w.gw.cfg.Audit = a
	const value = "s3cr3t-VALUE-9f8e7d"
	w.gw.SetSecrets([]Secret{{Name: "TOKEN", Host: "api.test", Header: "Authorization", Prefix: "Bearer", Value: value, Placeholder: "tine-placeholder-TOKEN"}})
	if _, body, err := w.get("https://api.test/"); !strings.Contains(body, `auth="Bearer `+value+`"`) {
		t.Errorf("bound destination: %q %v", body, err)
	}
	for _, u := range []string{"http://api.test/", "https://other.test/"} {
		if _, body, err := w.get(u); err != nil || strings.Contains(body, value) {
			t.Errorf("%s got the secret: %q %v", u, body, err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	joined := strings.Join(a.log, "\n")
	if !strings.Contains(joined, "credential") || !strings.Contains(joined, "secret=TOKEN") || strings.Contains(joined, value) {
		t.Errorf("audit: %s", joined)
	}
}
