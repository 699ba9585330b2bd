package sandbox_test

import (
	"context"
	"testing"
	"time"

	"tine/sandbox"
)

// A sandbox listening on more ports than auto-expose opens on the host
// gets exposures for the first 64 only: the host's listeners stay
// bounded whatever the sandbox does.
func TestAutoExposeIsBounded(t *testing.T) {
	e := newEnv(t, 0)
	e.create("many", sandbox.Limits{})
	e.mustSh("many", "for p in $(seq 21000 21079); do busybox nc -l -p $p >/dev/null 2>&1 & done; sleep 0.5")
	ctx := context.Background()
	if err := e.m.SetAutoExpose(ctx, "many", true); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		ex, err := e.m.Exposures("many")
		if err != nil {
			t.Fatal(err)
		}
		return len(ex)
	}
	deadline := time.Now().Add(30 * time.Second)
	for count() < 64 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // several auto-expose rounds
	if n := count(); n != 64 {
		t.Fatalf("%d exposures of a sandbox listening on 80 ports, want 64", n)
	}
	// An exposure asked for still works past the bound.
	ex, err := e.m.Exposures("many")
	if err != nil {
		t.Fatal(err)
	}
	exposed := map[int]bool{}
	for _, x := range ex {
		exposed[x.Port] = true
	}
	port := 21000
	for exposed[port] {
		port++
	}
	if _, err := e.m.Expose(ctx, "many", sandbox.ExposeOptions{Port: port}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 65 {
		t.Fatalf("%d exposures after exposing one more, want 65", n)
	}
}
