package ns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// manifest describes every entry under dir: type, mode, owner, size,
// mtime, device number, link count, symlink target, content and
// extended attributes.
func manifest(t *testing.T, dir string) []string {
	t.Helper()
	return walkManifest(t, dir, false)
}

// manifestFound is manifest leaving out the names a directory lists that
// are then not found (an overlay's whiteout in a directory the layers
// below do not have).
func manifestFound(t *testing.T, dir string) []string {
	t.Helper()
	return walkManifest(t, dir, true)
}

func walkManifest(t *testing.T, dir string, found bool) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if found && errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s mode=%o uid=%d gid=%d rdev=%d nlink=%d mtime=%d", rel, st.Mode, st.Uid, st.Gid, st.Rdev, st.Nlink, st.Mtim.Nano())
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" size=%d data=%q", st.Size, b)
		case unix.S_IFLNK:
			tgt, _ := os.Readlink(p)
			line += " -> " + tgt
		}
		sz, _ := unix.Llistxattr(p, nil)
		if sz > 0 {
			buf := make([]byte, sz)
			sz, _ = unix.Llistxattr(p, buf)
			names := strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00")
			sort.Strings(names)
			for _, n := range names {
				if n == "" {
					continue // every name hidden (overlayfs's own)
				}
				v := make([]byte, 256)
				k, _ := unix.Lgetxattr(p, n, v)
				line += fmt.Sprintf(" %s=%q", n, v[:max(k, 0)])
			}
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// makeLayer fills dir with what an overlay upper layer holds.
func makeLayer(t *testing.T, dir string, deep int) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc", "opaque"), 0o755))
	must(unix.Setxattr(filepath.Join(dir, "etc", "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644))
	must(unix.Setxattr(filepath.Join(dir, "etc", "passwd"), "user.note", []byte("kept"), 0))
	must(unix.Mknod(filepath.Join(dir, "etc", "gone"), unix.S_IFCHR|0o000, 0)) // a whiteout
	must(unix.Mkfifo(filepath.Join(dir, "etc", "fifo"), 0o640))
	must(os.WriteFile(filepath.Join(dir, "etc", "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chown(filepath.Join(dir, "etc", "suid"), 1000, 1000))
	must(os.Chmod(filepath.Join(dir, "etc", "suid"), 0o4755))
	must(os.Link(filepath.Join(dir, "etc", "passwd"), filepath.Join(dir, "etc", "passwd-link")))
	must(os.Symlink("../etc/passwd", filepath.Join(dir, "etc", "sym")))
	must(os.Symlink("/", filepath.Join(dir, "root-link")))
	must(os.WriteFile(filepath.Join(dir, "blob"), make([]byte, 300<<10), 0o600))
	must(os.Chown(filepath.Join(dir, "etc"), 12, 34))
	p := dir
	for i := 0; i < deep; i++ {
		p = filepath.Join(p, "d")
	}
	must(os.MkdirAll(p, 0o755))
	must(os.WriteFile(filepath.Join(p, "bottom"), []byte("b"), 0o644))
	// Times last: every write above changed some.
	must(filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		ts := []unix.Timespec{{Sec: 1000, Nsec: 5}, {Sec: 2000, Nsec: 7}}
		return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	}))
}

// TestCopyLayer: the in-process copy of a layer is what cp -a makes, for
// a shallow layer (copied in process) and for one deeper than it goes
// (copied by cp -a after the first try).
func TestCopyLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	for _, deep := range []int{3, maxLayerDepth + 5} {
		t.Run(fmt.Sprint(deep), func(t *testing.T) {
			base := t.TempDir()
			src := filepath.Join(base, "src")
			makeLayer(t, src, deep)
			ref := filepath.Join(base, "ref")
			if out, err := exec.Command("cp", "-a", src, ref).CombinedOutput(); err != nil {
				t.Fatalf("cp -a: %v: %s", err, out)
			}
			dst := filepath.Join(base, "dst")
			if err := copyLayer(context.Background(), src, dst); err != nil {
				t.Fatal(err)
			}
			want, got := manifest(t, ref), manifest(t, dst)
			if len(want) < 10+deep {
				t.Fatalf("the reference copy has %d entries: the check below proves little", len(want))
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				for i := range max(len(got), len(want)) {
					var g, w string
					if i < len(got) {
						g = got[i]
					}
					if i < len(want) {
						w = want[i]
					}
					if g != w {
						t.Errorf("entry %d:\n got %s\nwant %s", i, g, w)
					}
				}
			}
		})
	}
}

// TestCopyStateAtomic: CopyState puts a whole copy at its destination or
// nothing: a copy cut short (its context cancelled) leaves neither the
// destination nor its temporary directory, and a temporary directory
// that a crash left is replaced.
func TestCopyStateAtomic(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	base := t.TempDir()
	from := filepath.Join(base, "from")
	makeLayer(t, filepath.Join(from, upperDir), 3)
	var r Runtime
	to := filepath.Join(base, "to")
	tmp := filepath.Join(base, ".tmp-to")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.CopyState(ctx, from, to); err == nil {
		t.Fatal("a cancelled copy succeeded")
	}
	for _, p := range []string{to, tmp} {
		if _, err := os.Lstat(p); err == nil {
			t.Fatalf("%s left by a copy cut short", p)
		}
	}
	if err := os.MkdirAll(filepath.Join(tmp, upperDir, "stale"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.CopyState(context.Background(), from, to); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(tmp); err == nil {
		t.Fatalf("%s left after the copy", tmp)
	}
	want, got := manifest(t, filepath.Join(from, upperDir)), manifest(t, filepath.Join(to, upperDir))
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("copy differs from its source:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// bigDir makes n empty files with long names in the new directory dir,
// those with i%stride == 0 only (stride 1: all), and returns their names.
func bigDir(t *testing.T, dir string, n, stride int) []string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := 0; i < n; i += stride {
		name := fmt.Sprintf("%0240d", i)
		fd, err := unix.Open(filepath.Join(dir, name), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		names = append(names, name)
	}
	return names
}

// peakHeap runs fn and returns how far the heap grew above where it
// started, sampled while fn runs.
func peakHeap(fn func() error) (uint64, error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapAlloc, ms.HeapAlloc
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
			select {
			case <-done:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	err := fn()
	close(done)
	<-sampled
	return peak - base, err
}

// TestLayerWalksBigDirectory: a layer directory of 60,000 names of 240
// bytes (15 MB of names; a sandbox may make millions) is walked by the
// bound's count, copied by a snapshot and stacked for a fork without
// the daemon holding its names at once, and each walk sees every name,
// across the batches the directory is read in.
func TestLayerWalksBigDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test mounts a tmpfs")
	}
	const n = 60000
	// On a tmpfs: ext4 here takes 10 s and more to make and copy as many
	// files in one directory.
	base := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", base, "tmpfs", 0, "size=64m,nr_inodes=400k"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(base, unix.MNT_DETACH)
	upper, lower := filepath.Join(base, upperDir), filepath.Join(base, "lower")
	names := bigDir(t, filepath.Join(upper, "big"), n, 1)
	bigDir(t, filepath.Join(lower, "big"), n+3*dirBatch, 7) // half its names in the upper layer too
	// The walks that read a directory whole grew it by 29 MB.
	const most = 12 << 20
	var largest uint64
	in := &instance{dir: base}
	var counted int64
	grew, err := peakHeap(func() (err error) { counted, err = in.LayerBytes(1 << 40); return err })
	if err != nil {
		t.Fatal(err)
	}
	largest = max(largest, grew)
	if counted < n*minEntryBytes {
		t.Fatalf("the bound's walk counted %d bytes for %d entries", counted, n)
	}
	if grew > most {
		t.Fatalf("the bound's walk of %d names grew the heap by %d bytes", n, grew)
	}
	// The copy's index of the files (bounded on its own: TestIndexMemoryBounded)
	// is left out: no file counts as settled.
	clock := copyClock
	copyClock = func() time.Time { return time.Unix(0, 0) }
	defer func() { copyClock = clock }()
	cp := filepath.Join(base, "copy")
	if grew, err = peakHeap(func() error { return copyLayer(context.Background(), upper, cp) }); err != nil {
		t.Fatal(err)
	}
	largest = max(largest, grew)
	if grew > most {
		t.Fatalf("the copy of %d names grew the heap by %d bytes", n, grew)
	}
	stacked := filepath.Join(base, "stacked")
	if grew, err = peakHeap(func() error { return linkLayers(context.Background(), []string{upper, lower}, "", stacked) }); err != nil {
		t.Fatal(err)
	}
	largest = max(largest, grew)
	if grew > most {
		t.Fatalf("stacking two layers of %d names grew the heap by %d bytes", n, grew)
	}
	t.Logf("%d names of 240 bytes: the heap grew by %d bytes at most in a walk", n, largest)
	for what, want := range map[string]int{cp: len(names), stacked: n + 3*dirBatch/7 + 1} {
		d, err := os.Open(filepath.Join(what, "big"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.Readdirnames(-1)
		d.Close()
		if err != nil || len(got) < want-1 || len(got) > want+1 {
			t.Fatalf("%s holds %d names (%v), want %d", what, len(got), err, want)
		}
	}
}
