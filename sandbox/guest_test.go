package sandbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"tine/sandbox"
)

// sizedRuntime is a real ns runtime under another name that sizes its
// sandboxes as the vm runtime does (a GuestSizer: default 512M and 1
// vCPU, at most 3G) and records the guest size each Start was given.
type sizedRuntime struct {
	*namedRuntime
	mu     sync.Mutex
	starts map[string]*sandbox.GuestSize
}

func (r *sizedRuntime) Features() sandbox.Features { return sandbox.Features{} }

func (r *sizedRuntime) GuestSize(want *sandbox.GuestSize) (sandbox.GuestSize, error) {
	g := sandbox.GuestSize{MemoryBytes: 512 << 20, CPUs: 1}
	if want != nil && want.MemoryBytes != 0 {
		g.MemoryBytes = want.MemoryBytes
	}
	if want != nil && want.CPUs != 0 {
		g.CPUs = want.CPUs
	}
	if g.MemoryBytes > 3<<30 {
		return g, fmt.Errorf("guest memory %d: at most 3G", g.MemoryBytes)
	}
	return g, nil
}

func (r *sizedRuntime) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	r.mu.Lock()
	r.starts[spec.ID] = spec.Guest
	r.mu.Unlock()
	return r.namedRuntime.Start(ctx, spec)
}

// TestGuestSize: a guest size given at create reaches the runtime's
// Start, is kept in the sandbox's metadata and by its forks; the runtime's
// default fills in one not given; a size the runtime refuses, a size for
// a runtime that is no GuestSizer, and a size other than a snapshot's
// for a sandbox made from it are refused.
func TestGuestSize(t *testing.T) {
	vmish := &sizedRuntime{namedRuntime: newNamedRuntime(t, "sized"), starts: map[string]*sandbox.GuestSize{}}
	e := newEnvWith(t, sandbox.Options{Runtimes: []sandbox.Runtime{vmish}})
	ctx := context.Background()
	want := sandbox.GuestSize{MemoryBytes: 2 << 30, CPUs: 2}
	a, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "a", Dir: e.project, Runtime: "sized", Guest: &want})
	if err != nil {
		t.Fatal(err)
	}
	if a.Guest == nil || *a.Guest != want {
		t.Fatalf("created with guest %+v, want %+v", a.Guest, want)
	}
	st, err := e.m.Status(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if st.Guest == nil || *st.Guest != want {
		t.Fatalf("status shows guest %+v", st.Guest)
	}
	forks, err := e.m.Fork(ctx, "a", sandbox.ForkOptions{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if g := forks[0].Guest; g == nil || *g != want {
		t.Fatalf("fork has guest %+v, want %+v", g, want)
	}
	vmish.mu.Lock()
	for id, g := range vmish.starts {
		if g == nil || *g != want {
			t.Errorf("start %s was given guest %+v", id, g)
		}
	}
	vmish.mu.Unlock()
	b, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "b", Dir: e.project, Runtime: "sized"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Guest == nil || b.Guest.MemoryBytes != 512<<20 || b.Guest.CPUs != 1 {
		t.Fatalf("default guest %+v", b.Guest)
	}
	for _, tc := range []struct {
		o   sandbox.CreateOptions
		why string
	}{
		{sandbox.CreateOptions{Name: "c", Dir: e.project, Runtime: "sized", Guest: &sandbox.GuestSize{MemoryBytes: 4 << 30}}, "at most 3G"},
		{sandbox.CreateOptions{Name: "c", Dir: e.project, Guest: &want}, "for vm sandboxes"},
	} {
		if _, err := e.m.Create(ctx, tc.o); err == nil || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("create %+v: %v, want %q", tc.o.Guest, err, tc.why)
		}
	}
	s, err := e.m.Snapshot(ctx, "a", sandbox.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Guest == nil || *s.Guest != want {
		t.Fatalf("snapshot keeps guest %+v", s.Guest)
	}
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "c", Snapshot: s.ID, Guest: &sandbox.GuestSize{CPUs: 4}}); err == nil || !strings.Contains(err.Error(), "has that size") {
		t.Errorf("create from a snapshot with another size: %v", err)
	}
}
