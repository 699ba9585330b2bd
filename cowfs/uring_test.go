package cowfs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/cowfs/internal/fuseuring"
)

// needURing turns on the kernel's offer of FUSE over io_uring for the
// test and restores the setting after it.
func needURing(t *testing.T) {
	t.Helper()
	needFUSE(t)
	was, err := fuseuring.SetEnabled(true)
	if err != nil {
		t.Skipf("this kernel has no FUSE over io_uring (Linux 6.14+ with CONFIG_FUSE_IO_URING): %v", err)
	}
	if !was {
		t.Cleanup(func() { fuseuring.SetEnabled(false) })
	}
}

// TestURingTransport runs the same file work on a mount served over
// io_uring and on one served over /dev/fuse, and checks that both give
// the same tree and the same diff.
func TestURingTransport(t *testing.T) {
	needURing(t)
	f := openTestFS(t)
	ctx := context.Background()
	base := map[string]string{"a.txt": "alpha\n", "d/b.txt": "beta\n", "d/e/c.txt": "gamma\n", "link": "->a.txt"}
	src := t.TempDir()
	writeTree(t, src, base)
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	results := map[string][]Change{}
	for _, ring := range []bool{true, false} {
		name := "dev"
		if ring {
			name = "ring"
		}
		if err := f.Branch(ctx, snap, name); err != nil {
			t.Fatal(err)
		}
		mnt := t.TempDir()
		m, err := f.Mount(ctx, name, mnt, &MountOptions{NoURing: !ring})
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{true: "io_uring", false: "/dev/fuse"}[ring]
		if got := m.Transport(); got != want {
			t.Fatalf("%s: transport %q, want %q", name, got, want)
		}
		fileWork(t, mnt)
		if err := m.Unmount(); err != nil {
			t.Fatal(err)
		}
		if m.ring != nil {
			select {
			case <-m.ring.Ended():
			default:
				t.Errorf("%s: the rings of an unmounted connection were not given back", name)
			}
		}
		after, err := f.Snapshot(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := f.Diff(ctx, snap, after)
		if err != nil {
			t.Fatal(err)
		}
		results[name] = ch
	}
	if len(results["ring"]) == 0 || !slices.EqualFunc(results["ring"], results["dev"], func(a, b Change) bool { return a.Path == b.Path && a.Kind == b.Kind }) {
		t.Errorf("diffs differ:\nio_uring:  %v\n/dev/fuse: %v", results["ring"], results["dev"])
	}
}

// fileWork runs one of each kind of request on a mount and checks the
// answers: names, data in small and large pieces, attributes, extended
// attributes, links, renames, removal, a directory listing, fsync, and
// work from several goroutines at once.
func fileWork(t *testing.T, mnt string) {
	t.Helper()
	p := func(s string) string { return filepath.Join(mnt, s) }
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(p("d/e/c.txt")); err != nil || string(b) != "gamma\n" {
		t.Fatalf("read base file: %q %v", b, err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB: larger than one request
	check(os.WriteFile(p("big.bin"), big, 0o640))
	fd, err := unix.Open(p("big.bin"), unix.O_RDWR, 0)
	check(err)
	check(unix.Fsync(fd))
	unix.Close(fd)
	if b, err := os.ReadFile(p("big.bin")); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("read back 3 MiB: %d bytes, %v", len(b), err)
	}
	check(os.Chmod(p("big.bin"), 0o600))
	check(os.Chtimes(p("big.bin"), time.Unix(1e9, 0), time.Unix(1e9, 0)))
	st, err := os.Stat(p("big.bin"))
	check(err)
	if st.Mode().Perm() != 0o600 || st.Size() != int64(len(big)) || !st.ModTime().Equal(time.Unix(1e9, 0)) {
		t.Fatalf("attributes: %v %d %v", st.Mode(), st.Size(), st.ModTime())
	}
	check(unix.Setxattr(p("a.txt"), "user.k", []byte("v1"), 0))
	buf := make([]byte, 16)
	if n, err := unix.Getxattr(p("a.txt"), "user.k", buf); err != nil || string(buf[:n]) != "v1" {
		t.Fatalf("getxattr: %q %v", buf[:n], err)
	}
	check(os.Symlink("d/b.txt", p("s")))
	if l, err := os.Readlink(p("s")); err != nil || l != "d/b.txt" {
		t.Fatalf("readlink: %q %v", l, err)
	}
	check(os.Link(p("a.txt"), p("hard")))
	check(os.Rename(p("d/b.txt"), p("moved.txt")))
	check(os.MkdirAll(p("new/deep"), 0o755))
	check(os.Remove(p("d/e/c.txt")))
	check(os.Remove(p("d/e")))
	if _, err := os.Stat(p("d/e")); !os.IsNotExist(err) {
		t.Fatalf("removed directory still there: %v", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				name := p("new/deep/" + strings.Repeat("x", i+1) + "-" + string(rune('a'+j%26)))
				if err := os.WriteFile(name, []byte(name), 0o644); err != nil {
					errs <- err
					return
				}
				if b, err := os.ReadFile(name); err != nil || string(b) != name {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(p("new/deep"))
	check(err)
	if len(ents) != 8*26 {
		t.Fatalf("listing: %d entries, want %d", len(ents), 8*26)
	}
	// Large requests again, after the small ones gave their buffers'
	// tails back: the data must not come from the pages given back.
	big2 := bytes.Repeat([]byte("fedcba9876543210"), 3<<16)
	check(os.WriteFile(p("big2.bin"), big2, 0o640))
	if b, err := os.ReadFile(p("big2.bin")); err != nil || !bytes.Equal(b, big2) {
		t.Fatalf("read back the second 3 MiB: %d bytes, %v", len(b), err)
	}
	if b, err := os.ReadFile(p("big.bin")); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("read back the first 3 MiB again: %d bytes, %v", len(b), err)
	}
	// A program of its own (another process, its own CPUs) sees the same.
	out, err := exec.Command("sh", "-c", "cd "+mnt+" && ls && cat moved.txt hard").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "beta\nalpha\n") {
		t.Fatalf("sh: %q %v", out, err)
	}
}

// TestURingMountsDoNotWaitForEachOther holds one mount's request in its
// server (its branch lock taken, as a long commit takes it) and checks
// that a request to another mount, made from the same CPU, is answered
// meanwhile: each mount has its own ring threads.
func TestURingMountsDoNotWaitForEachOther(t *testing.T) {
	needURing(t)
	f := openTestFS(t)
	a, _ := mountNew(t, f, "a", map[string]string{"x": "1"})
	b, _ := mountNew(t, f, "b", map[string]string{"x": "1"})
	if a.Transport() != "io_uring" || b.Transport() != "io_uring" {
		t.Fatalf("transports %s, %s; want io_uring", a.Transport(), b.Transport())
	}
	onCPU0 := func(f func()) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(0)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				t.Error(err)
				return
			}
			f()
		}()
		return done
	}
	a.b.mu.Lock()
	held := onCPU0(func() { os.Stat(filepath.Join(a.Dir(), "held-up")) })
	time.Sleep(200 * time.Millisecond) // the lookup reaches a's server and waits for the lock
	other := onCPU0(func() {
		if _, err := os.Stat(filepath.Join(b.Dir(), "other")); !os.IsNotExist(err) {
			t.Errorf("stat in the other mount: %v, want ENOENT", err)
		}
	})
	select {
	case <-other:
	case <-time.After(10 * time.Second):
		t.Error("a request to one mount waited for another mount's request")
	}
	a.b.mu.Unlock()
	<-held
	<-other
}
