package sandbox

import (
	"fmt"
	"sync"
	"testing"

	"tine/audit"
)

// Appends racing the close of a removed sandbox's log lose nothing and
// keep the chain whole: the log is never open twice at once.
func TestForgetAuditRacingAppends(t *testing.T) {
	m := &Manager{root: t.TempDir()}
	for round := 0; round < 10; round++ {
		forgetRacingAppends(t, m, fmt.Sprintf("x%d", round))
	}
}

func forgetRacingAppends(t *testing.T, m *Manager, name string) {
	const writers, each = 4, 200
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if err := m.Audit(name, "exec", map[string]any{"i": i}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := 0; i < 100; i++ {
		m.forgetAudit(name)
	}
	wg.Wait()
	m.forgetAudit(name)
	p, _ := m.AuditPath(name)
	rep, err := audit.VerifyFile(p)
	if err != nil || !rep.OK() {
		t.Fatalf("%s after appends racing closes: %+v %v", name, rep, err)
	}
	if rep.Records != writers*each {
		t.Fatalf("%s: %d records, want %d", name, rep.Records, writers*each)
	}
}
