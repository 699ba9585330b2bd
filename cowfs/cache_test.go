package cowfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tine/chunkstore"
)

// cacheSize sums the sizes of the files in f's passthrough cache.
func cacheSize(t *testing.T, f *FS) (int64, int) {
	t.Helper()
	ents, err := os.ReadDir(f.cacheDir())
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		n += info.Size()
	}
	return n, len(ents)
}

// TestCacheStaysWithinBudget reads more distinct files than the cache
// holds: it stays within its budget, evicts the least recently used files
// but never one an open handle reads, keeps files larger than the budget
// out, and a later Open trims it to a smaller budget.
func TestCacheStaysWithinBudget(t *testing.T) {
	needFUSE(t)
	const mb, budget = 1 << 20, 3 << 20
	root := t.TempDir()
	f, err := Open(root, &Options{CacheBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"big": string(pattern(99, budget+1))}
	for i := range 8 {
		files[fmt.Sprintf("f%d", i)] = string(pattern(uint64(i), mb))
	}
	m, _ := mountNew(t, f, "main", files)
	read := func(name string) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(m.Dir(), name))
		if err != nil || !bytes.Equal(got, []byte(files[name])) {
			t.Fatalf("read %s: %d bytes, %v", name, len(got), err)
		}
	}
	held, err := os.Open(filepath.Join(m.Dir(), "f0"))
	if err != nil {
		t.Fatal(err)
	}
	heldCache := filepath.Join(f.cacheDir(), mustID(t, f, "main", "f0"))
	for i := 1; i < 8; i++ {
		read(fmt.Sprintf("f%d", i))
		time.Sleep(20 * time.Millisecond) // let the kernel release the handle
		if n, _ := cacheSize(t, f); n > budget+mb {
			t.Fatalf("after reading %d files the cache holds %d bytes, budget %d plus the one held open", i+1, n, budget)
		}
	}
	if _, err := os.Stat(heldCache); err != nil {
		t.Errorf("the cache file of a file held open was evicted: %v", err)
	}
	held.Close()
	read("big")
	n, k := cacheSize(t, f)
	t.Logf("cache after 9 files of %d MiB budget: %d bytes in %d files", budget/mb, n, k)
	if n > budget {
		t.Errorf("cache holds %d bytes, budget %d", n, budget)
	}
	if _, err := os.Stat(filepath.Join(f.cacheDir(), mustID(t, f, "main", "big"))); err == nil {
		t.Error("a file larger than the budget was cached")
	}
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, err = Open(root, &Options{CacheBytes: mb})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, _ := cacheSize(t, f); n > mb {
		t.Errorf("Open with a 1 MiB budget left %d bytes in the cache", n)
	}
}

// mustID returns the content id (hex) of file name in branch br's head.
func mustID(t *testing.T, f *FS, br, name string) string {
	t.Helper()
	head, err := f.Head(context.Background(), br)
	if err != nil {
		t.Fatal(err)
	}
	top, err := f.rootEntry(head)
	if err != nil {
		t.Fatal(err)
	}
	es, err := getDir(f.store, top.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Name == name {
			return e.ID.String()
		}
	}
	t.Fatalf("no %s in %s", name, br)
	return ""
}

// TestWriteChunks: a cache file's chunks, written on several goroutines,
// land at their offsets with holes left as zeros; a chunk the store lacks
// fails the write, naming it.
func TestWriteChunks(t *testing.T) {
	st, err := chunkstore.Open(filepath.Join(t.TempDir(), "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var refs []fileRef
	var want []byte
	for i := range 40 {
		size := 1000 + 37*i
		if i%7 == 3 {
			refs = append(refs, fileRef{Size: int64(size)}) // a hole
			want = append(want, make([]byte, size)...)
			continue
		}
		b := pattern(uint64(i), size)
		id, err := st.Put(b)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, fileRef{ID: id, Size: int64(size)})
		want = append(want, b...)
	}
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := writeChunks(st, refs, out); err != nil {
		t.Fatal(err)
	}
	if err := out.Truncate(int64(len(want))); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("written file differs from its chunks (%d bytes, want %d)", len(got), len(want))
	}

	missing := chunkstore.Sum([]byte("never stored"))
	refs[5] = fileRef{ID: missing, Size: refs[5].Size}
	if err := writeChunks(st, refs, out); err == nil || !strings.Contains(err.Error(), missing.String()) {
		t.Fatalf("write with a missing chunk: %v, want an error naming %s", err, missing)
	}
}
