package cowfs

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestBranchMany: all the branches are made in one update, each over
// the snapshot; a name that exists fails the whole call, leaves none of
// the others, and leaves the existing branch and its settings alone.
func TestBranchMany(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "one"})
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.BranchMany(ctx, snap, []string{"k1", "k2", "k3"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"k1", "k2", "k3"} {
		if id, ok, err := f.getRef(refBranch + n); err != nil || !ok || id != snap {
			t.Errorf("branch %s: %v %v %v, want %s", n, id, ok, err, snap)
		}
	}
	if err := f.SetQuota(ctx, "k2", 12345); err != nil {
		t.Fatal(err)
	}
	err = f.BranchMany(ctx, snap, []string{"n1", "k2", "n2"})
	if !errors.Is(err, ErrExists) {
		t.Fatalf("a batch naming an existing branch: %v, want ErrExists", err)
	}
	for _, n := range []string{"n1", "n2"} {
		if _, ok, _ := f.getRef(refBranch + n); ok {
			t.Errorf("branch %s was made by a batch that failed", n)
		}
	}
	if m, err := f.readMeta("k2"); err != nil || m.QuotaBytes != 12345 {
		t.Errorf("the existing branch's settings after a failed batch: %+v %v, want its quota kept", m, err)
	}
	if err := f.BranchMany(ctx, snap, []string{"d", "d"}); err == nil {
		t.Error("a batch naming one branch twice succeeded")
	}
}

// TestBranchManyDeferred: deferred branches are there at once, are lost
// by a crash before the next durable update (here a copy of the state
// taken while the FS is open), with their snapshot kept, and are kept by
// a crash after it.
func TestBranchManyDeferred(t *testing.T) {
	ctx := context.Background()
	f, snap := importOne(t)
	if err := f.BranchManyDeferred(ctx, snap, []string{"d1", "d2"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := f.getRef(refBranch + "d2"); !ok {
		t.Fatal("a deferred branch is not there at once")
	}
	if err := f.BranchManyDeferred(ctx, snap, []string{"d1"}); !errors.Is(err, ErrExists) {
		t.Errorf("a deferred branch of a taken name: %v, want ErrExists", err)
	}
	crashed := func() *FS {
		t.Helper()
		c := filepath.Join(t.TempDir(), "copy")
		if out, err := exec.Command("cp", "-a", f.root, c).CombinedOutput(); err != nil {
			t.Fatalf("copy the state: %v: %s", err, out)
		}
		cf, err := Open(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cf.Close() })
		return cf
	}
	c := crashed()
	if _, ok, _ := c.getRef(refBranch + "d1"); ok {
		t.Error("a deferred branch survived a crash before any durable update")
	}
	if _, ok, _ := c.getRef(refSnap + snap.String()); !ok {
		t.Error("the snapshot of the lost branches is gone")
	}
	if err := f.Branch(ctx, snap, "durable"); err != nil {
		t.Fatal(err)
	}
	c = crashed()
	for _, n := range []string{"d1", "d2", "durable"} {
		if id, ok, _ := c.getRef(refBranch + n); !ok || id != snap {
			t.Errorf("branch %s after a durable update and a crash: %v %v", n, id, ok)
		}
	}
}
