package cowfs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestRollbackDropsLongKernelCaches checks that the kernel's long-lived
// caches (entries, attributes, negative lookups, directory listings and
// page cache kept across opens; ADR 0160) never show a tree the branch
// left by a rollback, however deep the cached names are.
func TestRollbackDropsLongKernelCaches(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"d/e/f": "one", "d/e/g": "g"})
	dir := m.Dir()
	deep := filepath.Join(dir, "d", "e")
	if err := os.WriteFile(filepath.Join(deep, "f"), []byte("two-two"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(deep, "new"), []byte("n"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed, err := f.Snapshot(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	list := func() []string {
		t.Helper()
		ents, err := os.ReadDir(deep)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	// Fill every cache: contents (twice, so a kept page cache serves the
	// second), listing, attributes and a negative entry.
	for i := 0; i < 2; i++ {
		if got, err := os.ReadFile(filepath.Join(deep, "f")); err != nil || string(got) != "two-two" {
			t.Fatalf("d/e/f before rollback: %q, %v", got, err)
		}
	}
	if got := list(); !slices.Equal(got, []string{"f", "g", "new"}) {
		t.Fatalf("d/e before rollback: %v", got)
	}
	if _, err := os.Stat(filepath.Join(deep, "later")); !os.IsNotExist(err) {
		t.Fatalf("d/e/later before it exists: %v", err)
	}

	if err := f.Rollback(ctx, "main", base); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(deep, "f")); err != nil || string(got) != "one" {
		t.Errorf("d/e/f after rollback: %q, %v", got, err)
	}
	if st, err := os.Stat(filepath.Join(deep, "f")); err != nil || st.Size() != 3 {
		t.Errorf("d/e/f size after rollback: %v, %v", st, err)
	}
	if got := list(); !slices.Equal(got, []string{"f", "g"}) {
		t.Errorf("d/e after rollback: %v", got)
	}
	if _, err := os.Stat(filepath.Join(deep, "new")); !os.IsNotExist(err) {
		t.Errorf("d/e/new after rollback: %v", err)
	}

	// A name cached as missing appears when a rollback brings it.
	if err := os.WriteFile(filepath.Join(deep, "later"), []byte("l"), 0o644); err != nil {
		t.Fatal(err)
	}
	withLater, err := f.Snapshot(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Rollback(ctx, "main", changed); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(deep, "later")); !os.IsNotExist(err) {
		t.Errorf("d/e/later after rollback to a tree without it: %v", err)
	}
	if err := f.Rollback(ctx, "main", withLater); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(deep, "later")); err != nil || string(got) != "l" {
		t.Errorf("d/e/later after rollback to a tree with it: %q, %v", got, err)
	}
}

// TestPageCacheKeptAcrossOpens checks that a changed file's pages stay in
// the kernel's page cache after its last close (FOPEN_KEEP_CACHE), so the
// next open reads them without asking the server, and that NoKeepCache
// turns this off.
func TestPageCacheKeptAcrossOpens(t *testing.T) {
	needFUSE(t)
	for _, keep := range []bool{true, false} {
		f := openTestFS(t)
		ctx := context.Background()
		src := t.TempDir()
		writeTree(t, src, map[string]string{"a": "x"})
		snap, err := f.Import(ctx, src, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Branch(ctx, snap, "b"); err != nil {
			t.Fatal(err)
		}
		m, err := f.Mount(ctx, "b", t.TempDir(), &MountOptions{NoKeepCache: !keep})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(m.Dir(), "a")
		data := make([]byte, 64<<10)
		for i := range data {
			data[i] = byte(i)
		}
		// Written through the mount: a plain (not passthrough) open.
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := os.ReadFile(p); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(p, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		mem, err := unix.Mmap(fd, 0, len(data), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		vec := make([]byte, len(data)/os.Getpagesize())
		if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Fatal(errno)
		}
		resident := 0
		for _, v := range vec {
			resident += int(v & 1)
		}
		unix.Munmap(mem)
		unix.Close(fd)
		if keep && resident != len(vec) {
			t.Errorf("keep cache: %d of %d pages resident after a new open, want all", resident, len(vec))
		}
		if !keep && resident != 0 {
			t.Errorf("NoKeepCache: %d of %d pages resident after a new open, want none", resident, len(vec))
		}
		if err := m.Unmount(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPagesPut checks that a small file's content is in the kernel's page
// cache before its first read (ADR 0211): a file imported unchanged, and
// one written through the mount however its writes split its pages, read
// with no READ request; and that no put ever leaves an older version in
// the cache while the file is rewritten.
func TestPagesPut(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "pages", map[string]string{"imported": strings.Repeat("imported\n", 1000), "d/deeper": "deeper"})
	var reads atomic.Int64
	hook := func(branch string) {
		if branch == "pages" {
			reads.Add(1)
		}
	}
	readTestHook.Store(&hook)
	defer readTestHook.Store(nil)

	for _, name := range []string{"imported", "d/deeper"} {
		got, err := os.ReadFile(filepath.Join(m.Dir(), name))
		if err != nil || len(got) == 0 {
			t.Fatalf("%s: %d bytes, %v", name, len(got), err)
		}
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("%d READ requests reading unchanged files for the first time, want none", n)
	}

	// Puts end after the RELEASE, which the kernel sends after close
	// returns: count them.
	var putsDone atomic.Int64
	var delay atomic.Int64 // hold back every delay-th put
	putHook := func(done bool) {
		if done {
			putsDone.Add(1)
		} else if d := delay.Load(); d > 0 && putsDone.Load()%d == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	putTestHook.Store(&putHook)
	defer putTestHook.Store(nil)

	// Each file is written in pieces of these sizes: a partial last page,
	// pages split between two writes, a write within one page, and a file
	// too big for passthrough not yet committed.
	files := map[string][]int{"one": {5}, "split": {3000, 3000, 3000}, "inner": {4096, 10, 20, 4000}, "full": {8192},
		"big": {100000, 100000, 3}}
	want := map[string][]byte{}
	putsDone.Store(0)
	for name, pieces := range files {
		fd, err := os.Create(filepath.Join(m.Dir(), name))
		if err != nil {
			t.Fatal(err)
		}
		var all []byte
		for i, n := range pieces {
			p := bytes.Repeat([]byte{byte('a' + i)}, n)
			if _, err := fd.Write(p); err != nil {
				t.Fatal(err)
			}
			all = append(all, p...)
		}
		if err := fd.Close(); err != nil {
			t.Fatal(err)
		}
		want[name] = all
	}
	for deadline := time.Now().Add(5 * time.Second); putsDone.Load() < int64(len(files)); {
		if time.Now().After(deadline) {
			t.Fatalf("%d puts of %d files written", putsDone.Load(), len(files))
		}
		time.Sleep(time.Millisecond)
	}
	reads.Store(0)
	for name, w := range want {
		got, err := os.ReadFile(filepath.Join(m.Dir(), name))
		if err != nil || !bytes.Equal(got, w) {
			t.Fatalf("%s: read %d bytes (%v), want the %d written", name, len(got), err, len(w))
		}
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("%d READ requests for files just written, want none", n)
	}

	// Rewritten in place again and again, truncated or not, with some
	// puts held back so that the next open comes first: each version
	// reads back whole, never with bytes of one before it. A reader runs
	// meanwhile, holding pages locked for its READs.
	p := filepath.Join(m.Dir(), "again")
	delay.Store(4)
	stopReading := make(chan struct{})
	defer close(stopReading)
	go func() {
		for {
			select {
			case <-stopReading:
				return
			default:
				os.ReadFile(p)
			}
		}
	}()
	for i := range 400 {
		v := bytes.Repeat([]byte{byte('a' + i%26)}, 1+(i*7919)%(3*4096))
		if i%2 == 1 {
			// The same length as the version before, written over it.
			v = bytes.Repeat([]byte{byte('a' + i%26)}, 1+((i-1)*7919)%(3*4096))
			fd, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fd.Write(v); err != nil {
				t.Fatal(err)
			}
			fd.Close()
		} else if err := os.WriteFile(p, v, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("version %d: read %d bytes %q... (%v), want %d bytes of %q", i, len(got), got[:min(len(got), 8)], err, len(v), v[:1])
		}
	}
}
