package gateway

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
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

// credentialCounts sums the count field of a's credential records and
// returns it with the number of records.
func credentialCounts(t *testing.T, a *memAudit) (records, uses int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.log {
		if !strings.HasPrefix(l, "credential ") {
			continue
		}
		records++
		var n int
		for _, f := range strings.Fields(l) {
			if c, ok := strings.CutPrefix(f, "count="); ok {
				fmt.Sscan(c, &n)
			}
		}
		if n < 1 {
			t.Fatalf("credential record without a count: %s", l)
		}
		uses += n
	}
	return records, uses
}

// TestCredentialAuditBounded: a sandbox sending credentialed requests
// as fast as it can gets one audit record at the first and counted ones
// after, not a record a request; every use is counted, by the record a
// timer writes and by Close.
func TestCredentialAuditBounded(t *testing.T) {
	old := credEvery
	credEvery = 300 * time.Millisecond
	defer func() { credEvery = old }()
	w := newWorld(t, policy(t, "api.test"))
	a := &memAudit{}
	w.gw.cfg.Audit = a
	w.gw.SetSecrets([]Secret{{Name: "TOKEN", Host: "api.test", Header: "Authorization", Value: "v", Placeholder: "p"}})
	const n = 60
	start := time.Now()
	for range n {
		if _, _, err := w.get("https://api.test/"); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	time.Sleep(2 * credEvery) // the timer's record
	records, uses := credentialCounts(t, a)
	if uses != n {
		t.Fatalf("%d uses recorded of %d", uses, n)
	}
	if most := 2 + int(took/credEvery); records > most {
		t.Fatalf("%d records for %d requests in %v (at most %d)", records, n, took, most)
	}
	w.get("https://api.test/")
	w.gw.Close()
	if _, uses = credentialCounts(t, a); uses != n+1 {
		t.Fatalf("after Close: %d uses recorded of %d", uses, n+1)
	}
}
