package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"tine/guestagent/proto"
	"tine/netpolicy"
	"tine/sandbox"
	"tine/sandbox/ns"
)

// namedRuntime is a second, real ns runtime under another name; it counts
// the starts and state copies it does, to show which runtime the Manager
// picked.
type namedRuntime struct {
	*ns.Runtime
	name           string
	starts, copies atomic.Int32
	// captured, when set, runs as a capture's finish starts.
	captured func()
}

func newNamedRuntime(t *testing.T, name string) *namedRuntime {
	t.Helper()
	rt, err := ns.New(agentPath)
	if err != nil {
		t.Fatal(err)
	}
	return &namedRuntime{Runtime: rt, name: name}
}

func (r *namedRuntime) Name() string { return r.name }

func (r *namedRuntime) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	r.starts.Add(1)
	return r.Runtime.Start(ctx, spec)
}

func (r *namedRuntime) CopyState(ctx context.Context, from, to string) error {
	r.copies.Add(1)
	return r.Runtime.CopyState(ctx, from, to)
}

func (r *namedRuntime) CaptureState(ctx context.Context, from, to string) (func() error, error) {
	r.copies.Add(1)
	finish, err := r.Runtime.CaptureState(ctx, from, to)
	if err != nil {
		return nil, err
	}
	return func() error {
		if r.captured != nil {
			r.captured()
		}
		return finish()
	}, nil
}

// bareRuntime is a namedRuntime that declares none of the Manager's
// host-side parts (as the vm runtime does).
type bareRuntime struct{ *namedRuntime }

func (bareRuntime) Features() sandbox.Features { return sandbox.Features{} }

func TestRuntimeSelection(t *testing.T) {
	alt := newNamedRuntime(t, "ns-alt")
	e := newEnvWith(t, sandbox.Options{Runtimes: []sandbox.Runtime{alt}})
	ctx := context.Background()
	if got := e.m.Runtimes(); strings.Join(got, ",") != "ns,ns-alt" {
		t.Fatalf("Runtimes() = %v, want [ns ns-alt]", got)
	}

	a, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "a", Dir: e.project, Runtime: "ns-alt"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Runtime != "ns-alt" || alt.starts.Load() != 1 {
		t.Fatalf("created on %q with %d starts of ns-alt, want ns-alt and 1", a.Runtime, alt.starts.Load())
	}
	if out, _ := e.sh("a", "cat src/main.txt"); out != "v1\n" {
		t.Fatalf("sandbox a reads %q", out)
	}
	if b := e.create("b", sandbox.Limits{}); b.Runtime != "ns" || alt.starts.Load() != 1 {
		t.Fatalf("default sandbox on %q, ns-alt starts %d: want ns and still 1", b.Runtime, alt.starts.Load())
	}

	// Forks inherit their parent's runtime, through its snapshot.
	e.sh("a", "echo forked > state.txt")
	forks, err := e.m.Fork(ctx, "a", sandbox.ForkOptions{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		if f.Runtime != "ns-alt" {
			t.Errorf("fork %s runs %q, want ns-alt", f.Name, f.Runtime)
		}
		if out, _ := e.sh(f.Name, "cat state.txt"); out != "forked\n" {
			t.Errorf("fork %s reads %q", f.Name, out)
		}
	}
	if alt.starts.Load() != 3 || alt.copies.Load() < 1 {
		t.Fatalf("after the fork ns-alt did %d starts and %d copies, want 3 and at least 1", alt.starts.Load(), alt.copies.Load())
	}

	// Snapshot and rollback use the sandbox's runtime.
	copies := alt.copies.Load()
	s, err := e.m.Snapshot(ctx, "a", sandbox.SnapshotOptions{Name: "here"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Runtime != "ns-alt" {
		t.Fatalf("snapshot of a records runtime %q", s.Runtime)
	}
	if err := e.m.Rollback(ctx, "a", "here"); err != nil {
		t.Fatal(err)
	}
	if alt.copies.Load() != copies+2 || alt.starts.Load() != 4 {
		t.Fatalf("snapshot+rollback: ns-alt copies %d→%d, starts %d; want +2 and 4", copies, alt.copies.Load(), alt.starts.Load())
	}

	// What cannot be picked is refused, naming it.
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "c", Dir: e.project, Runtime: "nope"}); err == nil || !strings.Contains(err.Error(), `runtime "nope"`) {
		t.Fatalf("unknown runtime: %v", err)
	}
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "c", Snapshot: s.ID, Runtime: "ns"}); err == nil || !strings.Contains(err.Error(), "runs ns-alt") {
		t.Fatalf("snapshot of ns-alt made into ns: %v", err)
	}
	if _, err := e.m.Get("c"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("a refused create left sandbox c: %v", err)
	}

	// The runtime persists across Open: with both runtimes the fork starts
	// on ns-alt again; without it, starting is refused, naming it.
	if err := e.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	alt2 := newNamedRuntime(t, "ns-alt")
	e.m, err = sandbox.Open(ctx, e.root, e.fs, sandbox.Options{Runtime: e.rt, Runtimes: []sandbox.Runtime{alt2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Start(ctx, forks[0].Name); err != nil {
		t.Fatal(err)
	}
	if alt2.starts.Load() != 1 {
		t.Fatalf("restarted fork: %d starts of ns-alt after Open, want 1", alt2.starts.Load())
	}
	if out, _ := e.sh(forks[0].Name, "cat state.txt"); out != "forked\n" {
		t.Errorf("restarted fork reads %q", out)
	}
	if err := e.m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	e.m, err = sandbox.Open(ctx, e.root, e.fs, sandbox.Options{Runtime: e.rt})
	if err != nil {
		t.Fatal(err)
	}
	if infos, err := e.m.List(); err != nil || len(infos) != 4 {
		t.Fatalf("List without ns-alt: %d sandboxes, %v", len(infos), err)
	}
	if err := e.m.Start(ctx, "a"); err == nil || !strings.Contains(err.Error(), `runtime "ns-alt" is not one this manager runs`) {
		t.Fatalf("start of an ns-alt sandbox without that runtime: %v", err)
	}
	if err := e.m.Start(ctx, "b"); err != nil {
		t.Fatalf("start of the default sandbox: %v", err)
	}
}

func TestRuntimeOptionsChecked(t *testing.T) {
	fs := newEnv(t, 0).fs
	a := newNamedRuntime(t, "ns")
	if _, err := sandbox.Open(context.Background(), t.TempDir(), fs, sandbox.Options{Runtime: a, Runtimes: []sandbox.Runtime{a}}); err == nil || !strings.Contains(err.Error(), `two runtimes named "ns"`) {
		t.Fatalf("two runtimes under one name: %v", err)
	}
}

// A runtime without the Manager's network and cgroup parts has them
// refused, clearly, rather than ignored.
func TestRuntimeFeaturesRefused(t *testing.T) {
	bare := bareRuntime{newNamedRuntime(t, "bare")}
	e := newEnvWith(t, sandbox.Options{Runtimes: []sandbox.Runtime{bare}})
	ctx := context.Background()
	open, err := netpolicy.Parse("open", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.m.Create(ctx, sandbox.CreateOptions{Name: "x", Dir: e.project, Runtime: "bare", Network: open})
	if err == nil || !strings.Contains(err.Error(), "network policy is not built for bare sandboxes") {
		t.Fatalf("network policy on a bare sandbox: %v", err)
	}
	_, err = e.m.Create(ctx, sandbox.CreateOptions{Name: "x", Dir: e.project, Runtime: "bare", AutoExpose: true})
	if err == nil || !strings.Contains(err.Error(), "not built for bare sandboxes") {
		t.Fatalf("auto-expose on a bare sandbox: %v", err)
	}
	_, err = e.m.Create(ctx, sandbox.CreateOptions{Name: "x", Dir: e.project, Runtime: "bare", Limits: sandbox.Limits{Pids: 50}})
	if err == nil || !strings.Contains(err.Error(), "not built for bare sandboxes") {
		t.Fatalf("cgroup limits on a bare sandbox: %v", err)
	}
	if bare.starts.Load() != 0 {
		t.Fatalf("refused creates started %d sandboxes", bare.starts.Load())
	}
	// What it supports works: the project quota, mode none.
	none, _ := netpolicy.Parse("none", nil)
	x, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "x", Dir: e.project, Runtime: "bare", Network: none,
		Limits: sandbox.Limits{ProjectBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if x.Runtime != "bare" {
		t.Fatalf("runtime %q", x.Runtime)
	}
	if err := e.m.SetNetwork(ctx, "x", open); err == nil || !strings.Contains(err.Error(), "network policy is not built for bare sandboxes") {
		t.Fatalf("SetNetwork open on a bare sandbox: %v", err)
	}
	if _, err := e.m.UpdateLimits(ctx, "x", sandbox.Limits{LimitsExt: sandbox.LimitsExt{MemoryBytes: 64 << 20}}); err == nil || !strings.Contains(err.Error(), "not built for bare sandboxes") {
		t.Fatalf("memory limit on a bare sandbox: %v", err)
	}
	// A fork of it is bare too, and refuses the same.
	forks, err := e.m.Fork(ctx, "x", sandbox.ForkOptions{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.SetNetwork(ctx, forks[0].Name, open); err == nil || !strings.Contains(err.Error(), "not built for bare") {
		t.Fatalf("SetNetwork on a bare fork: %v", err)
	}
}

// A snapshot of a running sandbox keeps it frozen only while its state is
// copied: the copy is written out to disk (a syncfs, which waits for all
// the file system's dirty pages) after the thaw, so the sandbox answers
// while that runs.
func TestSnapshotThawsBeforeFlush(t *testing.T) {
	alt := newNamedRuntime(t, "ns-alt")
	e := newEnvWith(t, sandbox.Options{Runtimes: []sandbox.Runtime{alt}})
	ctx := context.Background()
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "a", Dir: e.project, Runtime: "ns-alt"}); err != nil {
		t.Fatal(err)
	}
	e.sh("a", "echo layer > /etc/tine-flush-test")
	answered := false
	alt.captured = func() {
		alt.captured = nil
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		p, err := e.m.Exec(ctx, "a", proto.ExecRequest{Argv: []string{"true"}})
		if err == nil {
			_, err = p.Wait(ctx)
		}
		if err != nil {
			t.Errorf("sandbox a did not answer while its snapshot was written out: %v", err)
		}
		answered = true
	}
	s, err := e.m.Snapshot(ctx, "a", sandbox.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !answered {
		t.Fatal("the ns runtime's state was not captured in two steps")
	}
	e.sh("a", "rm /etc/tine-flush-test")
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "b", Snapshot: s.ID}); err != nil {
		t.Fatal(err)
	}
	if out, _ := e.sh("b", "cat /etc/tine-flush-test"); out != "layer\n" {
		t.Fatalf("sandbox made from the snapshot reads %q, want the layer as it was", out)
	}
}
