package cowfs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
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

// TestWrittenPagesStored checks that a small file written through the
// mount is read back from the kernel's page cache after its last close,
// with no READ request, however its writes split its pages (ADR 0211),
// and that the file reads right while it is rewritten concurrently.
func TestWrittenPagesStored(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	ctx := context.Background()
	snap, err := f.Import(ctx, t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Branch(ctx, snap, "pages"); err != nil {
		t.Fatal(err)
	}
	m, err := f.Mount(ctx, "pages", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmount()
	var reads atomic.Int64
	hook := func(branch string) {
		if branch == "pages" {
			reads.Add(1)
		}
	}
	readTestHook.Store(&hook)
	defer readTestHook.Store(nil)

	// Each file is written in pieces of these sizes: a partial last page,
	// pages split between two writes, a write within one page.
	files := map[string][]int{"one": {5}, "split": {3000, 3000, 3000}, "inner": {4096, 10, 20, 4000}, "full": {8192}}
	want := map[string][]byte{}
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
	// The put follows the RELEASE, which the kernel sends after close
	// returns.
	deadline := time.Now().Add(5 * time.Second)
	for {
		reads.Store(0)
		for name, w := range want {
			got, err := os.ReadFile(filepath.Join(m.Dir(), name))
			if err != nil || !bytes.Equal(got, w) {
				t.Fatalf("%s: read %d bytes (%v), want the %d written", name, len(got), err, len(w))
			}
		}
		if reads.Load() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d READ requests for files just written, want none", reads.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Rewritten again and again, shorter and longer: each version reads
	// back whole, never with the bytes of the one before, whose put may
	// still be on its way when the next open truncates the file.
	// Some puts are held back, so that the next open comes first.
	p := filepath.Join(m.Dir(), "again")
	var puts atomic.Int64
	slow := func() {
		if puts.Add(1)%8 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	putTestHook.Store(&slow)
	defer putTestHook.Store(nil)
	// A reader meanwhile holds pages locked for its READs, which a put
	// waits for: neither may hold the other up.
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
	version := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 1+(i*7919)%(3*4096)) }
	for i := range 400 {
		v := version(i)
		if err := os.WriteFile(p, version(i+13), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, v, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("version %d: read %d bytes %q... (%v), want %d bytes of %q", i, len(got), got[:min(len(got), 8)], err, len(v), v[:1])
		}
	}
}
