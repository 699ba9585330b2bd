package cowfs

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// logRefs returns the fsync logs the store holds.
func logRefs(t *testing.T, f *FS) map[string]chunkstore.ID {
	t.Helper()
	refs, err := f.store.ListRefs(refPending)
	if err != nil {
		t.Fatal(err)
	}
	return refs
}

// writeSync writes data to path at off and fsyncs it.
func writeSync(t *testing.T, path string, data []byte, off int64) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
}

func checkFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes differ from the %d written", path, len(got), len(want))
	}
}

// An fsync of a file with many written bytes logs them; the commit a
// moment later stores them and drops the log.
func TestFsyncLogCommitBehind(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"small": "x"})
	data := pattern(1, 3<<20)
	p := filepath.Join(m.Dir(), "big")
	writeSync(t, p, data, 0)
	if n := len(logRefs(t, f)); n != 1 {
		t.Fatalf("after the fsync: %d fsync logs, want 1", n)
	}
	checkFile(t, p, data)
	deadline := time.Now().Add(10 * commitBehind)
	for len(logRefs(t, f)) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the log's bytes were not stored after", 10*commitBehind)
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkFile(t, p, data)
	verifyClean(t, f)
	// A small fsync'd write is stored at once.
	writeSync(t, filepath.Join(m.Dir(), "small"), []byte("y"), 0)
	if n := len(logRefs(t, f)); n != 0 {
		t.Fatalf("a one-byte fsync left %d logs", n)
	}
}

// Cutting or punching a logged file's overlay stores the log's bytes
// first, so that the log never names bytes that are gone.
func TestFsyncLogCutStoresFirst(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", nil)
	data := pattern(2, 3<<20)
	for _, cut := range []string{"truncate", "punch"} {
		p := filepath.Join(m.Dir(), cut)
		writeSync(t, p, data, 0)
		if n := len(logRefs(t, f)); n != 1 {
			t.Fatalf("%s: %d fsync logs, want 1", cut, n)
		}
		want := append([]byte(nil), data...)
		if cut == "truncate" {
			if err := os.Truncate(p, 1<<20); err != nil {
				t.Fatal(err)
			}
			want = want[:1<<20]
		} else {
			fh, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			err = unix.Fallocate(int(fh.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1<<20, 1<<20)
			fh.Close()
			if err != nil {
				t.Fatal(err)
			}
			clear(want[1<<20 : 2<<20])
		}
		if n := len(logRefs(t, f)); n != 0 {
			t.Fatalf("%s of a logged file left %d logs", cut, n)
		}
		checkFile(t, p, want)
	}
	verifyClean(t, f)
}

// Head, a snapshot and an unmount store the log's bytes: nothing outside
// the mount ever sees a head without them.
func TestFsyncLogHeadAndUnmount(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"d/base": string(pattern(3, 2<<20))})
	data := pattern(4, 2<<20)
	p := filepath.Join(m.Dir(), "d", "base")
	writeSync(t, p, data[:1<<20], 512<<10)
	want := append(pattern(3, 2<<20)[:512<<10], data[:1<<20]...)
	want = append(want, pattern(3, 2<<20)[len(want):]...)
	if n := len(logRefs(t, f)); n != 1 {
		t.Fatalf("%d fsync logs, want 1", n)
	}
	head, err := f.Head(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(logRefs(t, f)); n != 0 {
		t.Fatalf("Head left %d logs", n)
	}
	snap, err := f.Snapshot(ctx, "main")
	if err != nil || snap != head {
		t.Fatalf("snapshot %s (%v), want the head %s", snap, err, head)
	}
	writeSync(t, filepath.Join(m.Dir(), "new"), data, 0)
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n := len(logRefs(t, f)); n != 0 {
		t.Fatalf("unmount left %d logs", n)
	}
	mnt := mountAt(t, f, "main")
	checkFile(t, filepath.Join(mnt, "d", "base"), want)
	checkFile(t, filepath.Join(mnt, "new"), data)
	if err := f.Branch(ctx, snap, "copy"); err != nil {
		t.Fatal(err)
	}
	mc := mountAt(t, f, "copy")
	checkFile(t, filepath.Join(mc, "d", "base"), want)
	verifyClean(t, f)
}

// An overlay file the log needs stays on disk when its file goes, until
// the log does; a file of two names is logged once.
func TestFsyncLogKeepsOverlays(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", nil)
	data := pattern(5, 2<<20)
	p := filepath.Join(m.Dir(), "gone")
	writeSync(t, p, data, 0)
	if err := os.Link(p, filepath.Join(m.Dir(), "other")); err != nil {
		t.Fatal(err)
	}
	writeSync(t, p, data[:1], 0) // logs again, with two names
	_, l, err := f.readLog("main")
	if err != nil || l == nil || len(l.Files) != 1 {
		t.Fatalf("log %+v (%v), want one file", l, err)
	}
	ov := filepath.Join(f.branchDir("main"), "overlay", l.Files[0].Overlay)
	for _, n := range []string{"gone", "other"} {
		if err := os.Remove(filepath.Join(m.Dir(), n)); err != nil {
			t.Fatal(err)
		}
	}
	m.b.removals.drain()
	if _, err := os.Stat(ov); err != nil {
		t.Fatalf("the log's overlay went with its file: %v", err)
	}
	if _, err := f.Head(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	m.b.removals.drain()
	if _, err := os.Stat(ov); !os.IsNotExist(err) {
		t.Fatalf("the overlay stayed after the log went: %v", err)
	}
	verifyClean(t, f)
}

// A file written again after a commit gets an overlay file of another
// name: removing the old one (off the request path) never takes the new.
func TestOverlayNamesNotReused(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", nil)
	p := filepath.Join(m.Dir(), "f")
	data := pattern(6, 2<<20)
	var paths []string
	for i := range 3 {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		m.b.mu.Lock()
		paths = append(paths, m.b.root.children["f"].f.ovPath)
		m.b.mu.Unlock()
		if i < 2 {
			if _, err := f.Head(ctx, "main"); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.b.removals.drain()
	if paths[0] == paths[1] || paths[1] == paths[2] || paths[0] == paths[2] {
		t.Fatalf("overlay names reused: %q", paths)
	}
	if _, err := os.Stat(paths[2]); err != nil {
		t.Fatalf("the live overlay is gone: %v", err)
	}
	checkFile(t, p, data)
}

// crashAfterLoggedFsyncs makes a root whose branch main is served by a
// re-executed test binary, writes through it (each fsync logs), SIGKILLs
// it right after the last fsync and checks that the store holds one fsync
// log. It returns the root and what each path of main must read.
func crashAfterLoggedFsyncs(t *testing.T) (string, map[string][]byte) {
	t.Helper()
	base := pattern(7, 3<<20)
	root, mnt, cmd := serveInChild(t, map[string]string{"base": string(base), "sub/keep": "keep"})
	// A new file, an overwrite inside a committed one, a file grown by a
	// truncate then written, in a new directory: each fsync logs.
	big := pattern(8, 3<<20)
	writeSync(t, filepath.Join(mnt, "big"), big, 0)
	over := pattern(9, 3<<19)
	writeSync(t, filepath.Join(mnt, "base"), over, 1<<20)
	copy(base[1<<20:], over)
	if err := os.MkdirAll(filepath.Join(mnt, "sub", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	grown := filepath.Join(mnt, "sub", "deep", "grown")
	if err := os.WriteFile(grown, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(grown, 4<<20); err != nil {
		t.Fatal(err)
	}
	tail := pattern(10, 2<<20)
	writeSync(t, grown, tail, 2<<20)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	unix.Unmount(mnt, unix.MNT_DETACH)

	st, err := chunkstore.Open(filepath.Join(root, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := st.ListRefs(refPending)
	st.Close()
	if err != nil || len(logs) != 1 {
		t.Fatalf("after the kill: fsync logs %v (%v), want one (the test killed too late?)", logs, err)
	}
	return root, map[string][]byte{
		"big": big, "base": base, "sub/keep": []byte("keep"),
		"sub/deep/grown": append(make([]byte, 2<<20), tail...),
	}
}

// TestCrashFsyncLog SIGKILLs the serving process right after fsyncs that
// logged their bytes, then checks that opening the root folds the log in
// and that every fsync'd byte is there.
func TestCrashFsyncLog(t *testing.T) {
	needFUSE(t)
	root, want := crashAfterLoggedFsyncs(t)
	f, err := Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if n := len(logRefs(t, f)); n != 0 {
		t.Fatalf("Open left %d logs", n)
	}
	verifyClean(t, f)
	mnt := mountAt(t, f, "main")
	for p, data := range want {
		checkFile(t, filepath.Join(mnt, p), data)
	}
	if ovs, _ := filepath.Glob(filepath.Join(f.branchDir("main"), "overlay", "*")); len(ovs) != 0 {
		t.Fatalf("overlay files left after the fold: %q", ovs)
	}
}

// A log whose overlay files are gone (host-side damage) is not folded:
// the root opens, the branch says why it cannot open, and a rollback
// drops the log.
func TestFsyncLogDamaged(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	root, _ := crashAfterLoggedFsyncs(t)
	ovs, _ := filepath.Glob(filepath.Join(root, "branches", "main", "overlay", "*"))
	if len(ovs) == 0 {
		t.Fatal("no overlay files after the kill")
	}
	for _, o := range ovs {
		os.Remove(o)
	}
	f, err := Open(root, nil)
	if err != nil {
		t.Fatalf("Open with a damaged log: %v", err)
	}
	defer f.Close()
	mnt := t.TempDir()
	if m, err := f.Mount(ctx, "main", mnt, nil); err == nil {
		m.Unmount()
		t.Fatal("a branch whose log cannot be folded mounted")
	} else if !strings.Contains(err.Error(), "fsync") || !strings.Contains(err.Error(), "rollback") {
		t.Fatalf("mount error does not say what happened and what to do: %v", err)
	}
	pdir := filepath.Join(t.TempDir(), "pool")
	p, err := f.NewMountPool(ctx, pdir, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := p.Mount(ctx, "main"); err == nil {
		m.Unmount()
		t.Fatal("a branch whose log cannot be folded mounted from a pool")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Head(ctx, "main"); err == nil {
		t.Fatal("Head of a branch whose log cannot be folded worked")
	}
	snap, err := f.Resolve(ctx, "base")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Rollback(ctx, "main", snap); err != nil {
		t.Fatal(err)
	}
	if n := len(logRefs(t, f)); n != 0 {
		t.Fatalf("rollback left %d logs", n)
	}
	m, err := f.Mount(ctx, "main", mnt, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmount()
	checkFile(t, filepath.Join(mnt, "base"), pattern(7, 3<<20))
}

// FuzzDecodeLog feeds damaged fsync logs to the decoder: it must return an
// error or a log that is in range and survives a round trip.
func FuzzDecodeLog(f *testing.F) {
	id := chunkstore.Sum([]byte("x")).String()
	f.Add([]byte(`{"root":"` + id + `","files":[{"path":["YQ=="],"size":10,"extents":[[0,4],[6,10]],"overlay":"5-1"}]}`))
	f.Add([]byte(`{"root":"` + id + `","files":[{"path":["Li4="],"size":1,"extents":[[0,1]],"overlay":"../x"}]}`))
	f.Add([]byte(`{"root":"","files":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := decodeLog(b)
		if err != nil {
			return
		}
		for _, lf := range l.Files {
			if lf.Size < 0 || len(lf.Extents) == 0 || lf.Extents[len(lf.Extents)-1][1] > lf.Size || !overlayNameRE().MatchString(lf.Overlay) {
				t.Fatalf("decoded an out-of-range file: %+v", lf)
			}
			for _, n := range lf.Path {
				if checkEntryName(string(n)) != nil {
					t.Fatalf("decoded a bad name %q", n)
				}
			}
		}
		enc, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		l2, err := decodeLog(enc)
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		enc2, _ := json.Marshal(l2)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip changed the log:\n%s\n%s", enc, enc2)
		}
	})
}

// A file too deep for the log's budget is stored by the fsync instead: an
// fsync never fails for a long path.
func TestFsyncLogDeepPath(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", nil)
	name := strings.Repeat("d", 255)
	dirfd, err := unix.Open(m.Dir(), unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range logBudget / 300 {
		if err := unix.Mkdirat(dirfd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(dirfd, name, unix.O_DIRECTORY|unix.O_RDONLY, 0)
		unix.Close(dirfd)
		if err != nil {
			t.Fatal(err)
		}
		dirfd = next
	}
	fd, err := unix.Openat(dirfd, "deep", unix.O_CREAT|unix.O_RDWR, 0o644)
	unix.Close(dirfd)
	if err != nil {
		t.Fatal(err)
	}
	fh := os.NewFile(uintptr(fd), "deep")
	defer fh.Close()
	data := pattern(11, 2<<20)
	if _, err := fh.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatalf("fsync of a deep file: %v", err)
	}
	if n := len(logRefs(t, f)); n != 0 {
		t.Fatalf("a file past the log's budget was logged (%d logs)", n)
	}
	got := make([]byte, len(data))
	if _, err := fh.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
	verifyClean(t, f)
}

// The commit after an fsync cuts the logged files without the branch's
// lock: the mount serves a write meanwhile, and a file changed meanwhile
// is stored as it is after the change, never as the cut saw it.
func TestFsyncLogCutsUnlocked(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", nil)
	p, q := filepath.Join(m.Dir(), "changed"), filepath.Join(m.Dir(), "same")
	data, other := pattern(12, 3<<20), pattern(13, 2<<20)
	writeSync(t, q, other, 0)
	writeSync(t, p, data, 0)
	_, l, err := f.readLog("main")
	if err != nil || l == nil || len(l.Files) != 2 {
		t.Fatalf("log %+v (%v), want two files", l, err)
	}
	done := make(chan error, 1)
	hook := func() {
		// Served while the cut's result waits: the lock is free.
		fh, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err == nil {
			_, err = fh.WriteAt([]byte("late"), 1<<20)
			fh.Close()
		}
		done <- err
	}
	commitLoggedTestHook.Store(&hook)
	defer commitLoggedTestHook.Store(nil)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * commitBehind):
		t.Fatal("the commit after the fsync did not run")
	}
	copy(data[1<<20:], "late")
	deadline := time.Now().Add(10 * commitBehind)
	for len(logRefs(t, f)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(logRefs(t, f)); n != 0 {
		t.Fatalf("%d logs left after the commit", n)
	}
	m.b.mu.Lock()
	same, changed := m.b.root.children["same"].f, m.b.root.children["changed"].f
	sameStored, changedStored := !same.changed, !changed.changed
	m.b.mu.Unlock()
	if !sameStored || !changedStored {
		t.Fatalf("stored: same %v, changed %v; want both", sameStored, changedStored)
	}
	checkFile(t, p, data)
	checkFile(t, q, other)
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	mnt := mountAt(t, f, "main")
	checkFile(t, filepath.Join(mnt, "changed"), data)
	checkFile(t, filepath.Join(mnt, "same"), other)
	verifyClean(t, f)
}

// mountAt mounts branch name at a new directory until cleanup.
func mountAt(t *testing.T, f *FS, name string) string {
	t.Helper()
	mnt := t.TempDir()
	m, err := f.Mount(context.Background(), name, mnt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount() })
	return mnt
}
