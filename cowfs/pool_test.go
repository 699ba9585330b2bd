package cowfs

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// newTestPool makes a pool of n mounts under a temporary directory; the
// pool is closed at cleanup.
func newTestPool(t *testing.T, f *FS, n int) *MountPool {
	t.Helper()
	p, err := f.NewMountPool(context.Background(), filepath.Join(t.TempDir(), "pool"), n, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// poolFork forks name from snap through p; the mount is undone at cleanup.
func poolFork(t *testing.T, p *MountPool, snap SnapshotID, name string) *Mount {
	t.Helper()
	m, err := p.Fork(context.Background(), snap, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount() })
	return m
}

// mountsUnder lists the mount points under dir in /proc/self/mounts.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	fh, err := os.Open("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var out []string
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 1 && strings.HasPrefix(fields[1], dir+"/") {
			out = append(out, fields[1])
		}
	}
	return out
}

var poolFiles = map[string]string{
	"README":        "hello\n",
	"src/main.go":   "package main\n",
	"src/lib/a.txt": "a\n",
	"link":          "->README",
	"empty/":        "",
}

func TestPoolForkShowsSnapshot(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	src := t.TempDir()
	writeTree(t, src, poolFiles)
	if err := os.Chmod(src, 0o711); err != nil {
		t.Fatal(err)
	}
	snap, err := f.Import(context.Background(), src, "")
	if err != nil {
		t.Fatal(err)
	}
	p := newTestPool(t, f, 1)
	// The one placeholder is asked about names before it is bound: none
	// of its answers may stay in the kernel's caches.
	ph := filepath.Join(p.Dir(), "1")
	for _, name := range []string{"README", "src", "nothing"} {
		if _, err := os.Lstat(filepath.Join(ph, name)); err == nil {
			t.Fatalf("placeholder shows %s", name)
		}
	}
	if es, err := os.ReadDir(ph); err != nil || len(es) != 0 {
		t.Fatalf("placeholder lists %v, %v; want nothing", es, err)
	}
	// Creating needs a lookup first, which the placeholder refuses.
	if err := os.WriteFile(filepath.Join(ph, "README"), []byte("x"), 0o644); err == nil {
		t.Fatal("write into placeholder succeeded")
	}
	if err := os.Mkdir(filepath.Join(ph, "d"), 0o755); err == nil {
		t.Fatal("mkdir in placeholder succeeded")
	}
	if err := os.Chmod(ph, 0o700); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("chmod of placeholder: %v, want EROFS", err)
	}
	before, err := os.Stat(ph)
	if err != nil {
		t.Fatal(err)
	}

	m := poolFork(t, p, snap, "a")
	if m.Dir() != ph || m.Branch() != "a" {
		t.Fatalf("fork at %s of %q, want %s of %q", m.Dir(), m.Branch(), ph, "a")
	}
	// The root's attributes (cached by the stat above) are the snapshot's,
	// not the placeholder's.
	st, err := os.Stat(m.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o711 || st.Mode().Perm() == before.Mode().Perm() {
		t.Fatalf("root mode %v after binding, want 0711 (placeholder had %v)", st.Mode().Perm(), before.Mode().Perm())
	}
	// Names looked up in the placeholder resolve now (before any listing,
	// which would refresh the kernel's entries).
	for _, name := range []string{"README", "src/main.go"} {
		if _, err := os.Lstat(filepath.Join(m.Dir(), name)); err != nil {
			t.Fatalf("after binding: %v", err)
		}
	}
	if diff := cmp.Diff(expand(poolFiles), readTree(t, m.Dir())); diff != "" {
		t.Fatalf("pooled fork differs from snapshot (-want +got):\n%s", diff)
	}
}

func TestPoolForksAreIsolated(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	snap := importTree(t, f, poolFiles)
	p := newTestPool(t, f, 2)
	a := poolFork(t, p, snap, "a")
	b := poolFork(t, p, snap, "b")
	if a.Dir() == b.Dir() {
		t.Fatalf("two forks share %s", a.Dir())
	}
	if err := os.WriteFile(filepath.Join(a.Dir(), "README"), []byte("from a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(b.Dir(), "src/main.go")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.Dir(), "new"), []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantA := expand(poolFiles)
	wantA["README"] = "from a\n"
	wantB := expand(poolFiles)
	delete(wantB, "src/main.go")
	wantB["new"] = "b\n"
	for _, c := range []struct {
		m    *Mount
		want map[string]string
	}{{a, wantA}, {b, wantB}} {
		if diff := cmp.Diff(c.want, readTree(t, c.m.Dir())); diff != "" {
			t.Errorf("fork %q (-want +got):\n%s", c.m.Branch(), diff)
		}
	}
}

func TestPoolMountLifecycle(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	snap := importTree(t, f, poolFiles)
	p := newTestPool(t, f, 1)
	m := poolFork(t, p, snap, "a")
	if err := os.WriteFile(filepath.Join(m.Dir(), "out"), []byte("result\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s1, err := f.Snapshot(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	changes, err := f.Diff(ctx, snap, s1)
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 1 || changes[0].Path != "out" || changes[0].Kind != Added {
		t.Fatalf("diff after a write in a pooled fork: %+v, want out added", changes)
	}
	if err := f.Rollback(ctx, "a", snap); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(expand(poolFiles), readTree(t, m.Dir())); diff != "" {
		t.Fatalf("after rollback (-want +got):\n%s", diff)
	}
	if err := os.WriteFile(filepath.Join(m.Dir(), "kept"), []byte("k\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	if got := mountsUnder(t, p.Dir()); slices.Contains(got, m.Dir()) {
		t.Fatalf("%s still mounted after Unmount", m.Dir())
	}
	// Unmount committed the branch and released it: a plain mount sees
	// the last write.
	m2, err := f.Mount(ctx, "a", t.TempDir(), nil)
	if err != nil {
		t.Fatalf("mount after pooled unmount: %v", err)
	}
	defer m2.Unmount()
	want := expand(poolFiles)
	want["kept"] = "k\n"
	if diff := cmp.Diff(want, readTree(t, m2.Dir())); diff != "" {
		t.Fatalf("remounted (-want +got):\n%s", diff)
	}
}

func TestPoolRefills(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	snap := importTree(t, f, poolFiles)
	p := newTestPool(t, f, 2)
	dirs := map[string]bool{}
	for _, name := range []string{"a", "b", "c", "d"} {
		m := poolFork(t, p, snap, name)
		if dirs[m.Dir()] {
			t.Fatalf("fork %q got %s twice", name, m.Dir())
		}
		dirs[m.Dir()] = true
	}
	deadline := time.Now().Add(20 * time.Second)
	for p.Ready() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d ready mounts 20s after the forks, want 2 (refill error: %v)", p.Ready(), p.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := len(mountsUnder(t, p.Dir())); got != 6 {
		t.Fatalf("%d mounts under the pool, want 4 forks + 2 ready", got)
	}
}

func TestPoolCloseUnmounts(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	snap := importTree(t, f, poolFiles)
	p, err := f.NewMountPool(context.Background(), filepath.Join(t.TempDir(), "pool"), 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(mountsUnder(t, p.Dir())); got != 3 {
		t.Fatalf("%d mounts after NewMountPool, want 3", got)
	}
	m, err := p.Fork(context.Background(), snap, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mountsUnder(t, p.Dir()); len(got) != 1 || got[0] != m.Dir() {
		t.Fatalf("after Close: mounts %v, want only the fork at %s", got, m.Dir())
	}
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	if got := mountsUnder(t, p.Dir()); len(got) != 0 {
		t.Fatalf("mounts left: %v", got)
	}
	if _, err := p.Fork(context.Background(), snap, "b"); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("fork after Close: %v, want ErrPoolClosed", err)
	}
	// The failed fork left no branch behind.
	if _, err := f.Head(context.Background(), "b"); !errors.Is(err, ErrNoBranch) {
		t.Fatalf("branch of a failed fork: %v, want ErrNoBranch", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if spares, _ := filepath.Glob(filepath.Join(f.Root(), "branches", sparePrefix+"*")); len(spares) != 0 {
		t.Fatalf("spare state dirs left after Close: %v", spares)
	}
}

func TestPoolMountBusy(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	mountNew(t, f, "main", poolFiles)
	p := newTestPool(t, f, 1)
	if _, err := p.Mount(ctx, "main"); !errors.Is(err, ErrBusy) {
		t.Fatalf("pooled mount of a mounted branch: %v, want ErrBusy", err)
	}
	if p.Ready() != 1 {
		t.Fatalf("a refused mount took a placeholder: %d ready, want 1", p.Ready())
	}
	snap, err := f.Resolve(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	m := poolFork(t, p, snap, "side")
	if _, err := f.Mount(ctx, "side", t.TempDir(), nil); !errors.Is(err, ErrBusy) {
		t.Fatalf("plain mount of a pooled fork's branch: %v, want ErrBusy", err)
	}
	// The branch lock is held, as another process would find it.
	if _, err := lockFile(filepath.Join(f.branchDir("side"), "lock")); !errors.Is(err, ErrBusy) {
		t.Fatalf("lock of a pooled fork's branch: %v, want ErrBusy", err)
	}
	if _, err := p.Mount(ctx, m.Branch()); !errors.Is(err, ErrBusy) {
		t.Fatalf("second pooled mount: %v, want ErrBusy", err)
	}
	if _, err := p.Fork(ctx, snap, "side"); !errors.Is(err, ErrExists) {
		t.Fatalf("fork onto an existing branch: %v, want ErrExists", err)
	}
	if _, err := p.Mount(ctx, "missing"); !errors.Is(err, ErrNoBranch) {
		t.Fatalf("pooled mount of a missing branch: %v, want ErrNoBranch", err)
	}
}

func TestPoolSkipsPlaceholderUnmountedFromOutside(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	snap := importTree(t, f, poolFiles)
	p := newTestPool(t, f, 1)
	pm := <-p.ready // the refill waits for a take, so it stays away meanwhile
	if err := syscall.Unmount(pm.m.Dir(), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pm.m.served:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not stop 10s after its unmount")
	}
	p.ready <- pm
	m := poolFork(t, p, snap, "a")
	if m.Dir() == pm.m.Dir() {
		t.Fatal("fork bound to the placeholder unmounted from outside")
	}
	if diff := cmp.Diff(expand(poolFiles), readTree(t, m.Dir())); diff != "" {
		t.Fatalf("fork (-want +got):\n%s", diff)
	}
}

// TestPoolMountKeepsQuota: a branch whose quota was set before its first
// mount keeps it when a pooled mount binds it (the pool's ready-made state
// directory holds no settings, but the store does).
func TestPoolMountKeepsQuota(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	snap := importTree(t, f, poolFiles)
	ctx := context.Background()
	if err := f.Branch(ctx, snap, "q"); err != nil {
		t.Fatal(err)
	}
	if err := f.SetQuota(ctx, "q", 64<<10); err != nil {
		t.Fatal(err)
	}
	p := newTestPool(t, f, 1)
	m, err := p.Mount(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount() })
	err = os.WriteFile(filepath.Join(m.Dir(), "big"), make([]byte, 1<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("1 MiB into a 64 KiB quota through a pooled mount: %v", err)
	}
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	if _, q, err := f.BranchUsage(ctx, "q"); err != nil || q != 64<<10 {
		t.Fatalf("quota after the mount: %d, %v", q, err)
	}
}
