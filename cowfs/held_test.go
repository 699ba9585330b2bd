package cowfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fillNames creates empty files dir/prefixN until one is refused and
// returns how many were made and the refusal.
func fillNames(t *testing.T, dir, prefix string, most int) (int, error) {
	t.Helper()
	for i := range most {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s%d", prefix, i)))
		if err != nil {
			return i, err
		}
		f.Close()
	}
	return most, nil
}

// TestHeldBound: the names, inodes and xattrs a mount makes are bounded
// per branch and over all branches: creates and setxattrs past the bound
// fail with ENOSPC, removals give room back, and an unmount or a rollback
// gives back all of the branch's. Loading a tree larger than the bound is
// never refused.
func TestHeldBound(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	const per = inodeHeld + nameHeld + 2 // a file named like "a0"
	f := openTestFSWith(t, &Options{BranchHeldBytes: 20 * per, HeldBytes: 30 * per})
	seed := map[string]string{}
	for i := range 100 {
		seed[fmt.Sprintf("d/s%03d", i)] = "x"
	}
	m1, base := mountNew(t, f, "one", seed)

	// The seed tree (100 names, more than the bound) loads and renames.
	ents, err := os.ReadDir(filepath.Join(m1.Dir(), "d"))
	if err != nil || len(ents) != 100 {
		t.Fatalf("listing the seed: %d entries, %v", len(ents), err)
	}
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(m1.Dir(), "d", e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(filepath.Join(m1.Dir(), "d", "s000"), filepath.Join(m1.Dir(), "d", "t000")); err != nil {
		t.Fatal(err)
	}

	made, err := fillNames(t, m1.Dir(), "a", 1000)
	if !errors.Is(err, syscall.ENOSPC) || made < 19 || made > 20 {
		t.Fatalf("branch one made %d files, then %v; want about 20, then ENOSPC", made, err)
	}
	if err := os.Mkdir(filepath.Join(m1.Dir(), "dir"), 0o755); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("mkdir past the bound: %v, want ENOSPC", err)
	}
	if err := os.Symlink("a0", filepath.Join(m1.Dir(), "link")); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("symlink past the bound: %v, want ENOSPC", err)
	}
	// Removing names gives their room back.
	for i := range 5 {
		if err := os.Remove(filepath.Join(m1.Dir(), fmt.Sprintf("a%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if again, err := fillNames(t, m1.Dir(), "b", 1000); !errors.Is(err, syscall.ENOSPC) || again != 5 {
		t.Errorf("after 5 removals branch one made %d files, then %v; want 5, then ENOSPC", again, err)
	}
	// Xattrs count too; removing one gives its room back.
	p := filepath.Join(m1.Dir(), "b0")
	if err := unix.Setxattr(p, "user.big", make([]byte, 4*per), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a large xattr past the bound: %v, want ENOSPC", err)
	}
	if err := os.Remove(filepath.Join(m1.Dir(), "b1")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "user.small", make([]byte, 1000), 0); err != nil {
		t.Errorf("an xattr within the room of a removed file: %v", err)
	}
	if err := unix.Removexattr(p, "user.small"); err != nil {
		t.Fatal(err)
	}

	// A second branch gets what the FS bound leaves: 30 - 20 files.
	if err := f.Branch(ctx, base, "two"); err != nil {
		t.Fatal(err)
	}
	m2, err := f.Mount(ctx, "two", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Unmount()
	made2, err := fillNames(t, m2.Dir(), "a", 1000)
	if !errors.Is(err, syscall.ENOSPC) || made2 < 9 || made2 > 11 {
		t.Fatalf("branch two made %d files, then %v; want about 10 (what the FS bound leaves), then ENOSPC", made2, err)
	}
	// A rollback lets branch one's tree go, and with it its count.
	if err := f.Rollback(ctx, "one", base); err != nil {
		t.Fatal(err)
	}
	if again, err := fillNames(t, m2.Dir(), "c", 1000); !errors.Is(err, syscall.ENOSPC) || made2+again < 19 || made2+again > 20 {
		t.Errorf("after branch one's rollback branch two made %d more files (%d in all), then %v; want about 20 in all (its own bound), then ENOSPC", again, made2+again, err)
	}
	// An unmount gives back all of it.
	if err := m2.Unmount(); err != nil {
		t.Fatal(err)
	}
	if got := f.heldUsed.Load(); got != 0 {
		t.Errorf("after the rollback and the unmount %d bytes are held, want 0", got)
	}
	m1.Unmount()
	verifyClean(t, f)
}

// TestDirtyExtentsBounded: a file written one byte in every two keeps at
// most maxDirtyExtents written ranges in the server's memory (past them
// its content is stored), and reads back as written, before and after a
// remount.
func TestDirtyExtentsBounded(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	const size = 2 * (maxDirtyExtents + 1000)
	base := bytes.Repeat([]byte{'a'}, size)
	m, _ := mountNew(t, f, "main", map[string]string{"f": string(base)})
	p := filepath.Join(m.Dir(), "f")
	fh, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte{}, base...)
	most := 0
	for off := 0; off < size; off += 2 {
		if _, err := fh.WriteAt([]byte{'b'}, int64(off)); err != nil {
			t.Fatal(err)
		}
		want[off] = 'b'
		m.b.mu.Lock()
		most = max(most, len(m.b.root.children["f"].f.dirty))
		m.b.mu.Unlock()
	}
	// Past the file's end too, leaving a hole.
	if _, err := fh.WriteAt([]byte("end"), size+100); err != nil {
		t.Fatal(err)
	}
	want = append(append(want, make([]byte, 100)...), "end"...)
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
	if most > maxDirtyExtents {
		t.Errorf("the file kept %d written ranges, at most %d", most, maxDirtyExtents)
	}
	mustRead(t, p, want)
	m = remount(t, f, m)
	mustRead(t, filepath.Join(m.Dir(), "f"), want)
	verifyClean(t, f)
}

// TestCgroupMemory: the held budgets follow a memory limit of the
// process's cgroup (v1 or v2) below the host's memory, and ignore an
// unbounded one ("max", or v1's huge number).
func TestCgroupMemory(t *testing.T) {
	sys := t.TempDir()
	writeTree(t, sys, map[string]string{
		"svc/memory.max":                   "1073741824\n",
		"free/memory.max":                  "max\n",
		"memory/a/b/memory.limit_in_bytes": "536870912\n",
		"memory/big/memory.limit_in_bytes": "9223372036854771712\n",
	})
	const host = 8 << 30
	for _, c := range []struct {
		cgroups string
		want    int64
	}{
		{"0::/svc\n", 1 << 30},
		{"0::/free\n", host},
		{"4:memory:/a/b\n0::/\n", 512 << 20},
		{"4:cpu,memory:/a/b\n", 512 << 20},
		{"4:memory:/big\n", host},
		{"4:memory:/missing\n", host},
		{"4:memory:/../a/b\n", host},
		{"", host},
	} {
		if got := cgroupMemory([]byte(c.cgroups), sys, host); got != c.want {
			t.Errorf("cgroups %q: %d, want %d", c.cgroups, got, c.want)
		}
	}
}
