package cowfs

import (
	"context"
	"errors"
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
