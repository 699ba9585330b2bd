package api_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"tine/api"
	"tine/sandbox"
)

// TestUsageAll: GET /v1/usage gives every sandbox's limits and use in one
// call, from the cgroups and the store: a frozen sandbox's answer comes
// as fast (its agent cannot answer), processes started in a sandbox show
// in its pids, a file written shows in its project bytes, and a stopped
// sandbox has no usage; a file written to its OS layer shows in the
// layer's size.
func TestUsageAll(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	if _, err := e.c.Create(ctx, api.CreateRequest{Name: "busy", From: e.project, Limits: sandbox.Limits{Pids: 64}}); err != nil {
		t.Fatal(err)
	}
	e.create("idle")
	e.create("off")
	if err := e.c.Stop(ctx, "off"); err != nil {
		t.Fatal(err)
	}
	byName := func(r *api.UsageResponse) map[string]api.SandboxUsage {
		m := map[string]api.SandboxUsage{}
		for _, s := range r.Sandboxes {
			m[s.Name] = s
		}
		return m
	}
	before, err := e.c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	base := byName(before)["busy"]
	if len(before.Sandboxes) != 3 || base.Usage == nil || base.Usage.Pids == 0 || base.Usage.MemoryBytes == 0 || base.Limits.Pids != 64 ||
		base.LayerBoundBytes != sandbox.DefaultLayerBytes {
		t.Fatalf("usage: %+v", before)
	}
	if off := byName(before)["off"]; off.State != sandbox.Stopped || off.Usage != nil || off.UsageError != "" {
		t.Errorf("a stopped sandbox's usage: %+v", off)
	}

	// Five sleeps and a 1 MiB file, then freeze.
	e.sh("busy", "for i in 1 2 3 4 5; do sleep 1000 </dev/null >/dev/null 2>&1 & done; head -c 1048576 /dev/urandom > "+filepath.Join(e.project, "big"))
	if err := e.c.Freeze(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	// The agent of a frozen sandbox does not answer: the call must not
	// wait for it.
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	after, err := e.c.Usage(short)
	if err != nil {
		t.Fatalf("usage with a frozen sandbox (after %v): %v", time.Since(start), err)
	}
	busy := byName(after)["busy"]
	if busy.Frozen == "" || busy.State != sandbox.Running || busy.Usage == nil {
		t.Fatalf("frozen sandbox's usage: %+v", busy)
	}
	t.Logf("usage of %d sandboxes, one frozen, in %v; busy: %d pids before the sleeps, %d after", len(after.Sandboxes), time.Since(start), base.Usage.Pids, busy.Usage.Pids)
	if busy.Usage.Pids < base.Usage.Pids+5 {
		t.Errorf("pids %d after five sleeps, %d before", busy.Usage.Pids, base.Usage.Pids)
	}
	if busy.ProjectBytes < base.ProjectBytes+1<<20 {
		t.Errorf("project bytes %d after writing 1 MiB, %d before", busy.ProjectBytes, base.ProjectBytes)
	}
	if busy.Usage.CPUNanos <= base.Usage.CPUNanos || !after.Time.After(before.Time) {
		t.Errorf("cpu %d ns at %v, %d ns at %v", busy.Usage.CPUNanos, after.Time, base.Usage.CPUNanos, before.Time)
	}
	if idle := byName(after)["idle"]; idle.Frozen != "" || idle.Usage == nil {
		t.Errorf("the other sandbox: %+v", idle)
	}
	// The API's other view of the same sandbox agrees.
	if l, err := e.c.Limits(ctx, "busy"); err != nil || l.Frozen != busy.Frozen {
		t.Errorf("limits of busy: %+v %v", l, err)
	}
	if err := e.c.Thaw(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	thawed, err := e.c.Usage(ctx)
	if err != nil || byName(thawed)["busy"].Frozen != "" {
		t.Errorf("after thaw: %+v %v", thawed, err)
	}
	// A file written outside the project and its tmpfs counts in the OS
	// layer, which the daemon measures every few seconds.
	e.sh("idle", "head -c 2097152 /dev/urandom > /root/blob")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r, err := e.c.Usage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if u := byName(r)["idle"].Usage; u != nil && u.LayerBytes >= 2<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("OS layer after writing 2 MiB to it: %+v", byName(r)["idle"].Usage)
		}
	}
	if err := e.c.Remove(ctx, "idle"); err != nil {
		t.Fatal(err)
	}
	if gone, err := e.c.Usage(ctx); err != nil || len(gone.Sandboxes) != 2 {
		t.Errorf("after removing one: %+v %v", gone, err)
	}
}
