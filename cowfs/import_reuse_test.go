package cowfs

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// importCounting imports dir into f and returns the snapshot and the
// regular files it read (not reused).
func importCounting(t *testing.T, f *FS, dir string) (SnapshotID, []string) {
	t.Helper()
	var read []string
	importHook = func(path string) {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
			read = append(read, path)
		}
	}
	defer func() { importHook = nil }()
	id, err := f.Import(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	return id, read
}

// fresh imports dir into a new state root, without any index: what a
// re-import must produce.
func fresh(t *testing.T, dir string) SnapshotID {
	t.Helper()
	id, err := openTestFS(t).Import(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// settle waits until files written now are older than the racy margin
// of an import started after it.
func settle() { time.Sleep(racyMargin + 20*time.Millisecond) }

func TestImportReuseUnchanged(t *testing.T) {
	f := openTestFSWith(t, &Options{NoImportWatch: true}) // the index, not the watch
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "alpha", "d/b": "beta", "d/e/c": "gamma"})
	settle()
	id1, read1 := importCounting(t, f, src)
	if len(read1) != 3 {
		t.Fatalf("first import read %d files, want 3: %v", len(read1), read1)
	}
	id2, read2 := importCounting(t, f, src)
	if len(read2) != 0 {
		t.Errorf("re-import of an unchanged tree read %v", read2)
	}
	if id1 != id2 || id2 != fresh(t, src) {
		t.Errorf("re-import gave %s, first %s", id2, id1)
	}
	// A new file is read; the others are still reused.
	writeTree(t, src, map[string]string{"d/new": "delta"})
	id3, read3 := importCounting(t, f, src)
	if len(read3) != 1 || read3[0] != filepath.Join(src, "d/new") {
		t.Errorf("after adding d/new the import read %v", read3)
	}
	if id3 != fresh(t, src) {
		t.Error("import after adding a file differs from a fresh import")
	}
}

// TestImportReuseCatchesCtimeOnlyChange rewrites a file in place with
// other bytes of the same size and puts its mtime back (touch -r): only
// its ctime tells, and the re-import must read it.
func TestImportReuseCatchesCtimeOnlyChange(t *testing.T) {
	f := openTestFSWith(t, &Options{NoImportWatch: true}) // the index, not the watch
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "old content", "b": "untouched"})
	settle()
	importCounting(t, f, src)
	p := filepath.Join(src, "a")
	before, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	settle()
	if err := os.WriteFile(p, []byte("new content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, before.ModTime(), before.ModTime()); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(p)
	if after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		t.Fatal("the edit changed size or mtime: the test would prove nothing")
	}
	id, read := importCounting(t, f, src)
	if len(read) != 1 || read[0] != p {
		t.Errorf("import after a ctime-only change read %v, want only %s", read, p)
	}
	if id != fresh(t, src) {
		t.Error("import after a same-size, same-mtime edit kept the old content")
	}
}

// TestImportReuseCatchesSwap swaps two files of the same size and mtime
// by renames: each path now names the other's inode.
func TestImportReuseCatchesSwap(t *testing.T) {
	f := openTestFSWith(t, &Options{NoImportWatch: true}) // the index, not the watch
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "AAAA", "b": "BBBB"})
	stamp := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, n := range []string{"a", "b"} {
		if err := os.Chtimes(filepath.Join(src, n), stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	settle()
	id1, _ := importCounting(t, f, src)
	a, b, tmp := filepath.Join(src, "a"), filepath.Join(src, "b"), filepath.Join(src, "t")
	for _, mv := range [][2]string{{a, tmp}, {b, a}, {tmp, b}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	id2, read := importCounting(t, f, src)
	if id2 == id1 {
		t.Fatal("import after swapping two files gave the snapshot of before")
	}
	if id2 != fresh(t, src) {
		t.Error("import after a swap differs from a fresh import")
	}
	if len(read) != 2 {
		t.Errorf("import after a swap read %v, want both files", read)
	}
}

// TestImportReuseRacy edits a file right after an import, keeping size
// and mtime: its ctime may be stamped the same tick as before, which
// only the racy rule catches.
func TestImportReuseRacy(t *testing.T) {
	f := openTestFSWith(t, &Options{NoImportWatch: true}) // the index, not the watch
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "one"})
	p := filepath.Join(src, "a")
	fi, _ := os.Stat(p)
	for i := 0; i < 5; i++ {
		importCounting(t, f, src)
		if err := os.WriteFile(p, []byte{'x', byte('a' + i), 'z'}, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		if id, _ := importCounting(t, f, src); id != fresh(t, src) {
			t.Fatalf("round %d: an edit right after an import was missed", i)
		}
	}
}

// TestImportReuseDamagedIndex damages the index in several ways: each
// import reads every file and is right.
func TestImportReuseDamagedIndex(t *testing.T) {
	f := openTestFSWith(t, &Options{NoImportWatch: true}) // the index, not the watch
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "alpha", "b": "beta"})
	settle()
	want := fresh(t, src)
	ix := f.importIndexPath(src)
	for name, damage := range map[string]func([]byte) []byte{
		"flipped": func(b []byte) []byte { b[len(b)/2] ^= 1; return b },
		"cut":     func(b []byte) []byte { return b[:len(b)-5] },
		"empty":   func(b []byte) []byte { return nil },
		"garbage": func(b []byte) []byte { return []byte("tineimp1 not an index at all, really not") },
	} {
		t.Run(name, func(t *testing.T) {
			importCounting(t, f, src)
			b, err := os.ReadFile(ix)
			if err != nil {
				t.Fatal("no index after an import:", err)
			}
			if err := os.WriteFile(ix, damage(b), 0o600); err != nil {
				t.Fatal(err)
			}
			id, read := importCounting(t, f, src)
			if len(read) != 2 || id != want {
				t.Errorf("import with a damaged index read %v and gave %s, want both read and %s", read, id, want)
			}
		})
	}
}

// TestImportReuseIndexForOtherDir puts one directory's index where
// another's belongs: it is not used.
func TestImportReuseIndexForOtherDir(t *testing.T) {
	f := openTestFSWith(t, &Options{NoImportWatch: true}) // the index, not the watch
	src1, src2 := t.TempDir(), t.TempDir()
	writeTree(t, src1, map[string]string{"a": "alpha"})
	writeTree(t, src2, map[string]string{"a": "other"})
	settle()
	importCounting(t, f, src1)
	importCounting(t, f, src2)
	b, err := os.ReadFile(f.importIndexPath(src1))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.importIndexPath(src2), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if id, read := importCounting(t, f, src2); len(read) != 1 || id != fresh(t, src2) {
		t.Errorf("another directory's index was used: read %v", read)
	}
}

func FuzzDecodeImportIndex(f *testing.F) {
	ix := &importIndex{Dir: "/p", StartNs: 42, Recs: []indexRec{
		{Path: "/p/a", Stat: fileStat{Dev: 1, Ino: 2, Mode: 0o100644, Size: 3, MtimeNs: 4, CtimeNs: 5}, Size: 3},
		{Path: "/p/b", Xattrs: []Xattr{{Name: "user.x", Value: []byte("v")}}},
	}}
	f.Add(encodeImportIndex(ix))
	f.Add(encodeImportIndex(&importIndex{}))
	f.Add([]byte(importIndexMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := decodeImportIndex(b)
		if err != nil {
			return
		}
		if got := encodeImportIndex(ix); string(got) != string(b) {
			t.Fatalf("decoded index does not encode back to its input")
		}
	})
}

// BenchmarkImportUnchanged re-imports a tree of 200 files in 100
// directories, unchanged or with one file changed before each import,
// walked (the import index finds the unchanged files) or with the import
// watch (no walk when unchanged; a walk that also watches every
// directory again when changed).
func BenchmarkImportUnchanged(b *testing.B) {
	for _, c := range []struct {
		name    string
		opts    *Options
		changed bool
	}{
		{"walk", &Options{NoImportWatch: true}, false},
		{"walk-changed", &Options{NoImportWatch: true}, true},
		{"watched", nil, false},
		{"watched-changed", nil, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := openTestFSWith(b, c.opts)
			src := b.TempDir()
			files := map[string]string{}
			for i := 0; i < 200; i++ {
				files[filepath.Join("d"+strconv.Itoa(i%100), "f"+strconv.Itoa(i))] = string(make([]byte, 2000+i))
			}
			writeTree(b, src, files)
			settle()
			ctx := context.Background()
			if _, err := f.Import(ctx, src, ""); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if c.changed {
					b.StopTimer()
					if err := os.WriteFile(filepath.Join(src, "changed"), []byte(strconv.Itoa(i)), 0o644); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				if _, err := f.Import(ctx, src, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
