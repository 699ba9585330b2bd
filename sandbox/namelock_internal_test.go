package sandbox

import (
	"testing"
	"time"
)

// TestNameLocks: one name's lock excludes another holder of that name,
// not of another name, and is forgotten once nobody holds it.
func TestNameLocks(t *testing.T) {
	var n nameLocks
	unlockA := n.lock("a")
	got := make(chan string, 2)
	go func() { u := n.lock("b"); got <- "b"; u() }()
	go func() { u := n.lock("a"); got <- "a again"; u() }()
	if first := <-got; first != "b" {
		t.Fatalf("%s took its lock while a was held", first)
	}
	select {
	case s := <-got:
		t.Fatalf("%s took its lock while a was held", s)
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	if s := <-got; s != "a again" {
		t.Fatalf("got %s", s)
	}
	n.mu.Lock()
	left := len(n.locks)
	n.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d locks kept with nobody holding one", left)
	}
}
