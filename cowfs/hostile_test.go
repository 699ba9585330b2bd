package cowfs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// rssBytes returns the process's resident memory (the mount server runs in
// this process), after a GC has handed back what it can.
func rssBytes(t testing.TB) int64 {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	fh, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// memGuard fails the test when resident memory grew by more than limit
// since it was made; check logs the growth.
type memGuard struct {
	t     testing.TB
	start int64
	limit int64
}

func newMemGuard(t testing.TB, limit int64) *memGuard {
	if raceEnabled {
		limit *= 8 // the race detector's shadow memory
	}
	return &memGuard{t: t, start: rssBytes(t), limit: limit}
}

func (g *memGuard) check(what string) {
	g.t.Helper()
	grew := rssBytes(g.t) - g.start
	g.t.Logf("%s: server RSS grew %.1f MiB", what, float64(grew)/(1<<20))
	if grew > g.limit {
		g.t.Errorf("%s: server RSS grew %d bytes, want at most %d", what, grew, g.limit)
	}
}

// verifyClean runs Verify and fails on any problem.
func verifyClean(t testing.TB, f *FS) VerifyStats {
	t.Helper()
	st, err := f.Verify(context.Background(), func(p Problem) { t.Errorf("verify: %v", p) })
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// snapshotAndDiff takes a snapshot of main and diffs it against base: both
// must succeed, which needs every object of the tree to decode.
func snapshotAndDiff(t testing.TB, f *FS, base SnapshotID) SnapshotID {
	t.Helper()
	ctx := context.Background()
	snap, err := f.Snapshot(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Diff(ctx, base, snap); err != nil {
		t.Fatalf("diff of the snapshot: %v", err)
	}
	return snap
}

func fsyncPath(t testing.TB, p string) {
	t.Helper()
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := fh.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", p, err)
	}
}

// TestHostileSparseFiles: files of 1 TiB and 2^50 bytes that hold almost
// nothing cost the server almost nothing: commit, snapshot, remount and a
// read of the last byte keep its memory flat.
func TestHostileSparseFiles(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"a": "a"})
	g := newMemGuard(t, 32<<20)
	tib := filepath.Join(m.Dir(), "tib")
	fh, err := os.Create(tib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte("x"), 1<<40-1); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	huge := filepath.Join(m.Dir(), "huge")
	if err := os.WriteFile(huge, []byte("head"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 1<<50); err != nil {
		t.Fatal(err)
	}
	fsyncPath(t, huge)
	g.check("1 TiB and 2^50-byte sparse files committed")
	snapshotAndDiff(t, f, base)
	m = remount(t, f, m)
	tib, huge = filepath.Join(m.Dir(), "tib"), filepath.Join(m.Dir(), "huge")
	for _, c := range []struct {
		path string
		off  int64
		want byte
	}{{tib, 1<<40 - 1, 'x'}, {tib, 1 << 39, 0}, {huge, 0, 'h'}, {huge, 1<<50 - 1, 0}} {
		fh, err := os.Open(c.path)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := fh.ReadAt(b, c.off); err != nil || b[0] != c.want {
			t.Errorf("%s at %d: %q, %v; want %q", c.path, c.off, b, err, c.want)
		}
		fh.Close()
	}
	// Punch the data out again: no zeros are written.
	fh, err = os.OpenFile(tib, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(fh.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 1<<40); err != nil {
		t.Fatal(err)
	}
	fh.Sync()
	fh.Close()
	g.check("remounted, read and punched")
	verifyClean(t, f)
}

// TestHostileManyFiles: a directory of many empty files (1M; 20k with
// -short) commits, snapshots, remounts and lists, with bounded memory.
func TestHostileManyFiles(t *testing.T) {
	needFUSE(t)
	n := 1_000_000
	if testing.Short() {
		n = 20_000
	}
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"a": "a"})
	g := newMemGuard(t, int64(n)*3072+64<<20)
	dir := filepath.Join(m.Dir(), "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		fd, err := unix.Openat(dfd, fmt.Sprintf("f%07d", i), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o644)
		if err != nil {
			t.Fatalf("create file %d: %v", i, err)
		}
		unix.Close(fd)
	}
	if err := unix.Fsync(dfd); err != nil {
		t.Fatal(err)
	}
	unix.Close(dfd)
	g.check(fmt.Sprintf("%d files made and committed", n))
	snapshotAndDiff(t, f, base)
	m = remount(t, f, m)
	ents, err := os.ReadDir(filepath.Join(m.Dir(), "many"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != n {
		t.Errorf("readdir after remount: %d entries, want %d", len(ents), n)
	}
	g.check(fmt.Sprintf("%d files remounted and listed", n))
	verifyClean(t, f)
}

// TestHostileDeepTree: 4096 nested directories, made with openat-relative
// mkdirs, commit, snapshot, remount and verify, with the goroutine stacks
// capped so that a walk recursing once per level would die.
func TestHostileDeepTree(t *testing.T) {
	needFUSE(t)
	const depth = 4096
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"a": "a"})
	g := newMemGuard(t, 64<<20)
	oldMax := debug.SetMaxStack(256 << 10)
	walk := func(mk bool) int {
		fd, err := unix.Open(m.Dir(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for ; n < depth; n++ {
			if mk {
				if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
					t.Fatalf("mkdir at depth %d: %v", n, err)
				}
			}
			nfd, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				break
			}
			unix.Close(fd)
			fd = nfd
		}
		if mk {
			if err := unix.Fsync(fd); err != nil {
				t.Fatalf("fsync at depth %d: %v", n, err)
			}
		}
		unix.Close(fd)
		return n
	}
	walk(true)
	if _, err := f.Snapshot(context.Background(), "main"); err != nil {
		t.Fatal(err)
	}
	m = remount(t, f, m)
	if got := walk(false); got != depth {
		t.Errorf("after remount the tree is %d deep, want %d", got, depth)
	}
	if st := verifyClean(t, f); st.Dirs < depth {
		t.Errorf("verify decoded %d directories, want at least %d", st.Dirs, depth)
	}
	g.check("4096-deep tree")
	debug.SetMaxStack(oldMax) // Diff recurses once per level
	snapshotAndDiff(t, f, base)
}

// TestHostileNames: names of 255 bytes work, 256 are refused with
// ENAMETOOLONG; symlink targets up to 4095 bytes survive a remount.
func TestHostileNames(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"a": "a"})
	long := strings.Repeat("n", 255)
	if err := os.WriteFile(filepath.Join(m.Dir(), long), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mk := range []func(string) error{
		func(p string) error { return os.WriteFile(p, nil, 0o644) },
		func(p string) error { return os.Mkdir(p, 0o755) },
		func(p string) error { return os.Symlink("x", p) },
		func(p string) error { return os.Link(filepath.Join(m.Dir(), long), p) },
		func(p string) error { return os.Rename(filepath.Join(m.Dir(), "a"), p) },
	} {
		if err := mk(filepath.Join(m.Dir(), long+"x")); !errors.Is(err, syscall.ENAMETOOLONG) {
			t.Errorf("256-byte name: %v, want ENAMETOOLONG", err)
		}
	}
	target := strings.Repeat("t/", 2047) + "t" // 4095 bytes
	if err := os.Symlink(target, filepath.Join(m.Dir(), "sl")); err != nil {
		t.Fatal(err)
	}
	snapshotAndDiff(t, f, base)
	m = remount(t, f, m)
	if _, err := os.Stat(filepath.Join(m.Dir(), long)); err != nil {
		t.Error(err)
	}
	if got, err := os.Readlink(filepath.Join(m.Dir(), "sl")); err != nil || got != target {
		t.Errorf("readlink after remount: %d bytes, %v", len(got), err)
	}
	verifyClean(t, f)
}

// TestHostileHardLinkFarm: one file with 10,000 more names; snapshot,
// remount and the link counts are right.
func TestHostileHardLinkFarm(t *testing.T) {
	needFUSE(t)
	const links = 10_000
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"a": "a", "farm/": ""})
	g := newMemGuard(t, 64<<20)
	src := filepath.Join(m.Dir(), "a")
	for i := range links {
		if err := os.Link(src, filepath.Join(m.Dir(), "farm", fmt.Sprintf("l%05d", i))); err != nil {
			t.Fatalf("link %d: %v", i, err)
		}
	}
	fsyncPath(t, src)
	snapshotAndDiff(t, f, base)
	m = remount(t, f, m)
	for _, p := range []string{"a", "farm/l00000", "farm/l09999"} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(m.Dir(), p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Nlink != links+1 {
			t.Errorf("%s: nlink %d, want %d", p, st.Nlink, links+1)
		}
	}
	g.check("10,000-link farm")
	verifyClean(t, f)
}

// TestHostileXattrFlood: setting 65,537 xattrs on one file is refused
// cleanly before the entry would pass the limits, and the snapshot stays
// readable: Diff works, a remount lists the xattrs, Verify finds nothing.
func TestHostileXattrFlood(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"a": "a"})
	p := filepath.Join(m.Dir(), "a")
	if err := unix.Setxattr(p, "user.", nil, 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("setxattr of the bare name %q: %v, want EINVAL", "user.", err)
	}
	set, refused := 0, error(nil)
	for i := 0; i < 65_537; i++ {
		if err := unix.Setxattr(p, fmt.Sprintf("user.%d", i), nil, 0); err != nil {
			refused = err
			break
		}
		set++
	}
	if !errors.Is(refused, syscall.ENOSPC) {
		t.Fatalf("after %d xattrs: %v, want ENOSPC", set, refused)
	}
	// Large values are refused once they pass the bytes an entry may hold.
	big := make([]byte, maxXattrValueLen)
	q := filepath.Join(m.Dir(), "big")
	if err := os.WriteFile(q, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	for i := 0; i < 5 && err == nil; i++ {
		err = unix.Setxattr(q, fmt.Sprintf("user.%d", i), big, 0)
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("five 64 KiB values: %v, want ENOSPC", err)
	}
	fsyncPath(t, p)
	snapshotAndDiff(t, f, base)
	m = remount(t, f, m)
	sz, err := unix.Listxattr(filepath.Join(m.Dir(), "a"), nil)
	if err != nil {
		t.Fatalf("listxattr after remount: %v", err)
	}
	buf := make([]byte, sz)
	sz, err = unix.Listxattr(filepath.Join(m.Dir(), "a"), buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(buf[:sz]), "\x00"); got != set {
		t.Errorf("remount lists %d xattrs, want %d", got, set)
	}
	t.Logf("%d xattrs set before ENOSPC", set)
	verifyClean(t, f)
}
