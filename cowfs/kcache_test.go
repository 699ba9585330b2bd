package cowfs

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
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
