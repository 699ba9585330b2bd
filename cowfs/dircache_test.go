package cowfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"tine/chunkstore"
)

// Decoded directories are served from the cache by content address,
// as copies: changing what a caller got changes nothing later callers
// see. The cache stays within its bound.
func TestDirCache(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "1", "d/b": "2", "d/c": "3"})
	if err := os.WriteFile(filepath.Join(src, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	snap1, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(src, "d/c"), []byte("changed"), 0o644)
	snap2, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	top, err := f.rootEntry(snap1)
	if err != nil {
		t.Fatal(err)
	}
	es, err := f.getDir(top.ID)
	if err != nil {
		t.Fatal(err)
	}
	hits := f.dirs.hits
	again, err := f.getDir(top.ID)
	if err != nil {
		t.Fatal(err)
	}
	if f.dirs.hits != hits+1 {
		t.Fatalf("second read of directory %s did not come from the cache", top.ID)
	}
	want := fmt.Sprint(again)
	es[0].Name = "mangled"
	es[0].Xattrs = append(es[0].Xattrs, Xattr{Name: "user.x", Value: []byte("v")})
	again[1].Size = 999
	if got, _ := f.getDir(top.ID); fmt.Sprint(got) != want {
		t.Fatalf("a caller's change reached the cache:\n got %v\nwant %s", got, want)
	}

	// Two diffs of the same snapshots: the second decodes nothing.
	d1, err := f.Diff(ctx, snap1, snap2)
	if err != nil {
		t.Fatal(err)
	}
	hits = f.dirs.hits
	d2, err := f.Diff(ctx, snap1, snap2)
	if err != nil {
		t.Fatal(err)
	}
	if len(d1) != 1 || len(d2) != 1 || d1[0].Path != "d/c" || d2[0].Path != "d/c" {
		t.Fatalf("diffs: %v then %v, want one change of d/c", d1, d2)
	}
	if f.dirs.hits < hits+4 { // two roots, two top directories, two d's
		t.Errorf("second diff took %d directories from the cache, want at least 4", f.dirs.hits-hits)
	}

	// The bound holds: a small cache keeps only the latest directories.
	c := dirCache{max: 4096}
	for i := range 100 {
		c.put(chunkIDOf(i), []Entry{{Name: fmt.Sprint(i), Type: TypeFile}})
		if c.used > c.max {
			t.Fatalf("cache holds %d bytes, bound %d", c.used, c.max)
		}
	}
	if _, ok := c.get(chunkIDOf(99)); !ok {
		t.Error("latest directory was evicted")
	}
	if _, ok := c.get(chunkIDOf(0)); ok {
		t.Error("oldest directory still cached past the bound")
	}
}

func chunkIDOf(i int) chunkstore.ID {
	var id chunkstore.ID
	id[0], id[1] = byte(i), byte(i>>8)
	return id
}
