package cowfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// importOne opens a store holding a one-file snapshot.
func importOne(t *testing.T) (*FS, SnapshotID) {
	t.Helper()
	f := openTestFS(t)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "one"})
	snap, err := f.Import(context.Background(), src, "")
	if err != nil {
		t.Fatal(err)
	}
	return f, snap
}

// TestMetaLegacyFile: a branch whose settings are still in its meta.json
// file (stores written before the meta ref) keeps them; once they are
// written again the ref holds them, and it wins over the file.
func TestMetaLegacyFile(t *testing.T) {
	ctx := context.Background()
	f, snap := importOne(t)
	if err := f.Branch(ctx, snap, "old"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(f.branchDir("old"), 0o700); err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(f.branchDir("old"), "meta.json")
	if err := os.WriteFile(legacy, []byte(`{"quota_bytes":5000,"used_bytes":1234}`), 0o600); err != nil {
		t.Fatal(err)
	}
	used, quota, err := f.BranchUsage(ctx, "old")
	if err != nil || used != 1234 || quota != 5000 {
		t.Fatalf("usage from the legacy file: %d of %d (%v), want 1234 of 5000", used, quota, err)
	}
	if err := f.SetQuota(ctx, "old", 9000); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := f.getRef(refMeta + "old"); !ok {
		t.Fatal("SetQuota wrote no meta ref")
	}
	used, quota, err = f.BranchUsage(ctx, "old")
	if err != nil || used != 1234 || quota != 9000 {
		t.Errorf("usage after SetQuota: %d of %d (%v), want 1234 of 9000", used, quota, err)
	}
}

// TestMetaGoesWithTheBranch: deleting a branch deletes its settings, so
// a new branch of the same name starts with no quota and nothing charged.
func TestMetaGoesWithTheBranch(t *testing.T) {
	ctx := context.Background()
	f, snap := importOne(t)
	if err := f.Branch(ctx, snap, "b"); err != nil {
		t.Fatal(err)
	}
	if err := f.SetQuota(ctx, "b", 777); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteBranch(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := f.getRef(refMeta + "b"); ok {
		t.Error("the meta ref outlived its branch")
	}
	if err := f.Branch(ctx, snap, "b"); err != nil {
		t.Fatal(err)
	}
	if used, quota, err := f.BranchUsage(ctx, "b"); err != nil || used != 0 || quota != 0 {
		t.Errorf("a new branch of a deleted one's name: %d of %d (%v), want 0 of 0", used, quota, err)
	}
}

// TestMetaCommittedWithTheHead: a snapshot moves the quota count with the
// head, in the store, and writes no settings file beside it.
func TestMetaCommittedWithTheHead(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"a": "a"})
	if err := f.SetQuota(ctx, "main", 10<<20); err != nil {
		t.Fatal(err)
	}
	before, _, _ := f.getRef(refMeta + "main")
	if err := os.WriteFile(filepath.Join(m.Dir(), "data"), make([]byte, 100<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Snapshot(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	after, _, _ := f.getRef(refMeta + "main")
	if after == before {
		t.Fatal("the snapshot did not move the meta ref")
	}
	meta, err := f.readMeta("main")
	if err != nil || meta.UsedBytes < 100<<10 || meta.QuotaBytes != 10<<20 {
		t.Errorf("meta after the snapshot: %+v (%v), want at least %d used of %d", meta, err, 100<<10, 10<<20)
	}
	if _, err := os.Stat(filepath.Join(f.branchDir("main"), "meta.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a settings file beside the store: %v", err)
	}
}

// TestVerifyReportsBadMeta: a meta ref naming an object that is not
// settings is a problem Verify reports, and meta refs are not walked as
// trees.
func TestVerifyReportsBadMeta(t *testing.T) {
	ctx := context.Background()
	f, snap := importOne(t)
	for _, n := range []string{"good", "bad"} {
		if err := f.Branch(ctx, snap, n); err != nil {
			t.Fatal(err)
		}
		if err := f.SetQuota(ctx, n, 100); err != nil {
			t.Fatal(err)
		}
	}
	var problems []Problem
	if _, err := f.Verify(ctx, func(p Problem) { problems = append(problems, p) }); err != nil || len(problems) != 0 {
		t.Fatalf("healthy store: problems %v (%v)", problems, err)
	}
	junk, err := f.store.Put([]byte("not settings"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.setRef(refMeta+"bad", junk); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Verify(ctx, func(p Problem) { problems = append(problems, p) }); err != nil {
		t.Fatal(err)
	}
	if len(problems) != 1 || problems[0].Ref != refMeta+"bad" || !strings.Contains(problems[0].Err.Error(), "corrupt") {
		t.Errorf("problems %v, want one for %s", problems, refMeta+"bad")
	}
}
