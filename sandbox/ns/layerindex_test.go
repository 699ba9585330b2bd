package ns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sameContent is manifest without link counts: a copy that links files
// of an earlier copy raises theirs.
func sameContent(t *testing.T, a, b string) {
	t.Helper()
	nlink := regexp.MustCompile(` nlink=\d+`)
	strip := func(m []string) string { return nlink.ReplaceAllString(strings.Join(m, "\n"), "") }
	if ga, gb := strip(manifest(t, a)), strip(manifest(t, b)); ga != gb {
		t.Fatalf("%s differs from %s:\n%s\nwant\n%s", b, a, gb, ga)
	}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	return idOf(t, p).ino
}

func idOf(t *testing.T, p string) fileID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return fileID{st.Dev, st.Ino}
}

// settle writes dir's file system out and waits past the racy window,
// so that the files written so far are ones a copy may record.
func settle(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	time.Sleep(racyWindow + 20*time.Millisecond)
}

// TestCopyLayerIndexed: a copy given the index of an earlier one links
// the files that did not change and copies the rest, and every copy is
// its source: files rewritten, re-moded or new, and files written
// through a shared mapping, whose times change only when a page turns
// dirty.
func TestCopyLayerIndexed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	ctx := context.Background()
	base := t.TempDir()
	src := filepath.Join(base, "src")
	makeLayer(t, src, 2)
	for _, n := range []string{"same", "rewritten", "moded", "mapped", "sneaky"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte(n+" 0123456789"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	settle(t, src)
	copyTo := func(name string, ref *layerIndex) (string, *layerIndex) {
		t.Helper()
		dst := filepath.Join(base, name)
		x, err := copyLayerIndexed(ctx, src, dst, ref)
		if err != nil {
			t.Fatal(err)
		}
		if x == nil {
			t.Fatal("no index from an in-process copy")
		}
		sameContent(t, src, dst)
		return dst, x
	}
	c1, x1 := copyTo("c1", nil)
	for _, n := range []string{"same", "blob", "etc/passwd", "mapped"} {
		if _, ok := x1.files[idOf(t, filepath.Join(src, n))]; !ok {
			t.Fatalf("settled file %s is not in the first copy's index", n)
		}
	}

	// Changes: one file rewritten (same size), one re-moded, one new,
	// and one rewritten with its times set back, which only its ctime
	// tells.
	var old unix.Stat_t
	if err := unix.Lstat(filepath.Join(src, "sneaky"), &old); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "sneaky"), []byte("SNEAKY 0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.UtimesNano(filepath.Join(src, "sneaky"), []unix.Timespec{old.Atim, old.Mtim}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "rewritten"), []byte("REWRITTEN 0123456789"[:len("rewritten 0123456789")]), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "moded"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	c2, x2 := copyTo("c2", x1)
	if inode(t, filepath.Join(c2, "same")) != inode(t, filepath.Join(c1, "same")) ||
		inode(t, filepath.Join(c2, "blob")) != inode(t, filepath.Join(c1, "blob")) {
		t.Fatal("an unchanged file was copied again, not linked")
	}
	for _, n := range []string{"rewritten", "moded", "sneaky"} {
		if inode(t, filepath.Join(c2, n)) == inode(t, filepath.Join(c1, n)) {
			t.Fatalf("changed file %s was linked from the earlier copy", n)
		}
	}
	// The hard link pair stays one pair in the copy.
	if inode(t, filepath.Join(c2, "etc/passwd")) != inode(t, filepath.Join(c2, "etc/passwd-link")) {
		t.Fatal("a hard-linked pair was split")
	}

	// A shared mapping written: the first write to a clean page sets the
	// times, so the next copy copies it; the page is dirty then, so that
	// copy does not record it, and a second write through the mapping,
	// which sets no time, is copied too.
	f, err := os.OpenFile(filepath.Join(src, "mapped"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	m[0] = 'M'
	time.Sleep(racyWindow + 20*time.Millisecond) // its ctime old enough to be recorded, were it not dirty
	c3, x3 := copyTo("c3", x2)
	if inode(t, filepath.Join(c3, "mapped")) == inode(t, filepath.Join(c2, "mapped")) {
		t.Fatal("a file written through a mapping was linked from the earlier copy")
	}
	m[1] = 'N'
	c4, _ := copyTo("c4", x3)
	if b, _ := os.ReadFile(filepath.Join(c4, "mapped")); !strings.HasPrefix(string(b), "MN") {
		t.Fatalf("copy after a second write through the mapping holds %q", b)
	}
	if inode(t, filepath.Join(c4, "same")) != inode(t, filepath.Join(c1, "same")) {
		t.Fatal("an unchanged file was not linked through a chain of copies")
	}

	// An earlier copy removed: its files are copied, not lost.
	if err := os.RemoveAll(c4); err != nil {
		t.Fatal(err)
	}
	_, x5 := copyTo("c5", x3)
	os.RemoveAll(c3)
	os.RemoveAll(c2)
	os.RemoveAll(c1)
	copyTo("c6", x5)
}

// TestCaptureStateReuses: the runtime remembers a sandbox's last copy,
// so that the next snapshot links its unchanged files, and forgets it
// when the layer is another directory (after a rollback).
func TestCaptureStateReuses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	ctx := context.Background()
	base := t.TempDir()
	from := filepath.Join(base, "sandbox")
	makeLayer(t, filepath.Join(from, upperDir), 2)
	settle(t, from)
	var r Runtime
	for _, n := range []string{"s1", "s2"} {
		if err := r.CopyState(ctx, from, filepath.Join(base, n)); err != nil {
			t.Fatal(err)
		}
		sameContent(t, filepath.Join(from, upperDir), filepath.Join(base, n, upperDir))
	}
	if inode(t, filepath.Join(base, "s2", upperDir, "blob")) != inode(t, filepath.Join(base, "s1", upperDir, "blob")) {
		t.Fatal("the second snapshot copied an unchanged file again")
	}
	// The layer replaced by another directory with the same names.
	if err := os.Rename(filepath.Join(from, upperDir), filepath.Join(base, "old")); err != nil {
		t.Fatal(err)
	}
	makeLayer(t, filepath.Join(from, upperDir), 2)
	settle(t, from)
	if err := r.CopyState(ctx, from, filepath.Join(base, "s3")); err != nil {
		t.Fatal(err)
	}
	sameContent(t, filepath.Join(from, upperDir), filepath.Join(base, "s3", upperDir))
	if inode(t, filepath.Join(base, "s3", upperDir, "blob")) == inode(t, filepath.Join(base, "s2", upperDir, "blob")) {
		t.Fatal("a copy of a new layer linked a file of the old one's copy")
	}
}

// TestPrecopy: the copy made ahead of a freeze holds the files the last
// copy did not, and the frozen copy links those unchanged since and
// copies the ones changed meanwhile; too little to copy is left to the
// frozen copy.
func TestPrecopy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	ctx := context.Background()
	base := t.TempDir()
	src := filepath.Join(base, "src")
	makeLayer(t, src, 2)
	time.Sleep(racyWindow + 20*time.Millisecond)
	if x, err := precopy(ctx, src, filepath.Join(base, "pre0")); err != nil || x != nil {
		t.Fatalf("precopy of a 300 KiB layer: index %v, %v; want none (below precopyMin)", x, err)
	}
	if _, err := os.Lstat(filepath.Join(base, "pre0")); err == nil {
		t.Fatal("precopy below precopyMin made its directory")
	}
	big := make([]byte, precopyMin+1)
	for i := range big {
		big[i] = byte(i * 7)
	}
	for _, n := range []string{"big", "big2"} {
		if err := os.WriteFile(filepath.Join(src, n), big, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(racyWindow + 20*time.Millisecond)
	pre := filepath.Join(base, "pre")
	x, err := precopy(ctx, src, pre)
	if err != nil || x == nil {
		t.Fatalf("precopy: index %v, %v", x, err)
	}
	if _, ok := x.files[idOf(t, filepath.Join(src, "big"))]; !ok {
		t.Fatal("the pre-copy does not hold the big file")
	}
	// Changed between the pre-copy and the frozen copy.
	big[0] ^= 0xff
	if err := os.WriteFile(filepath.Join(src, "big2"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "dst")
	if _, err := copyLayerIndexed(ctx, src, dst, nil, x); err != nil {
		t.Fatal(err)
	}
	sameContent(t, src, dst)
	if got, want := inode(t, filepath.Join(dst, "big")), inode(t, filepath.Join(pre, x.files[idOf(t, filepath.Join(src, "big"))].rel)); got != want {
		t.Fatal("the frozen copy copied a file the pre-copy held unchanged")
	}
	if e, ok := x.files[idOf(t, filepath.Join(src, "big2"))]; ok && inode(t, filepath.Join(dst, "big2")) == inode(t, filepath.Join(pre, e.rel)) {
		t.Fatal("the frozen copy linked a file changed since the pre-copy")
	}

	// Through the runtime: PrepareState, then CopyState's capture.
	from := filepath.Join(base, "sandbox")
	if err := os.MkdirAll(from, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(src, filepath.Join(from, upperDir)); err != nil {
		t.Fatal(err)
	}
	var r Runtime
	to := filepath.Join(base, "snap", "runtime")
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.PrepareState(ctx, from, to); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(preDir(to)); err != nil {
		t.Fatalf("PrepareState of 2 MiB to copy made no pre-copy: %v", err)
	}
	if err := r.CopyState(ctx, from, to); err != nil {
		t.Fatal(err)
	}
	sameContent(t, filepath.Join(from, upperDir), filepath.Join(to, upperDir))
	if _, err := os.Lstat(preDir(to)); err == nil {
		t.Fatal("the pre-copy is left after the capture")
	}
}

// TestIndexMemoryBounded: the sandbox names its files, so an index is
// bounded in bytes (a path may be 4 KiB), and the runtime keeps the
// indexes of a bounded number of sandboxes and bytes, the oldest going.
func TestIndexMemoryBounded(t *testing.T) {
	x := &layerIndex{files: map[fileID]indexed{}}
	long := strings.Repeat("d/", 2000)
	for i := 0; x.bytes+entryBytes(long) <= maxIndexBytes; i++ {
		x.add(fileID{1, uint64(i)}, stamp{}, long)
	}
	n := len(x.files)
	x.add(fileID{2, 0}, stamp{}, long)
	if len(x.files) != n || x.bytes > maxIndexBytes {
		t.Fatalf("an index took %d entries, %d bytes: more than maxIndexBytes", len(x.files), x.bytes)
	}
	var c captures
	for i := range maxCaptures + 8 {
		c.put(fmt.Sprint(i), &layerIndex{bytes: 1})
	}
	if len(c.last) != maxCaptures || c.last["0"] != nil || c.last[fmt.Sprint(maxCaptures+7)] == nil {
		t.Fatalf("kept %d indexes (want the last %d)", len(c.last), maxCaptures)
	}
	for i := range 8 {
		c.put(fmt.Sprint("big", i), &layerIndex{bytes: maxIndexBytes})
	}
	total := 0
	for _, y := range c.last {
		total += y.bytes
	}
	if total > maxCaptureBytes || c.last["big7"] == nil {
		t.Fatalf("indexes kept hold %d bytes (at most %d, the newest kept)", total, maxCaptureBytes)
	}
}

// swapDir swaps the directory d for a symlink to host and back, as fast
// as it can, until the test ends: a sandbox racing the host's walk of
// its layer.
func swapDir(t *testing.T, d, host string) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		real := d + ".real"
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.Rename(d, real)
			os.Symlink(host, d)
			os.Remove(d)
			os.Rename(real, d)
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// TestPrecopyLayerSwapped: the sandbox runs while its layer is copied
// ahead, and may swap a directory of it for a symlink to a host
// directory, back and forth: the pre-copy never reads through it (no
// host file's bytes or attributes in the copy), and a file the swap
// hides is left to the frozen copy.
func TestPrecopyLayerSwapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: owners and trusted.* attributes")
	}
	ctx := context.Background()
	base := t.TempDir()
	upper, host := filepath.Join(base, "upper"), filepath.Join(base, "host")
	secret := []byte(strings.Repeat("host secret ", precopyMin/8))
	mine := []byte(strings.Repeat("sandbox file", precopyMin/8))
	for _, d := range []string{filepath.Join(upper, "d"), host} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(host, "f"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(host, "f"), "user.secret", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, "d", "f"), mine, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(racyWindow + 20*time.Millisecond)
	swapDir(t, filepath.Join(upper, "d"), host)
	for i := range 30 {
		pre := filepath.Join(base, fmt.Sprint("pre", i))
		x, err := precopy(ctx, upper, pre)
		if err != nil {
			t.Fatalf("precopy %d: %v", i, err)
		}
		if x == nil {
			continue // the swap hid the file from the first walk
		}
		ents, _ := os.ReadDir(pre)
		for _, ent := range ents {
			p := filepath.Join(pre, ent.Name())
			if b, _ := os.ReadFile(p); string(b) == string(secret) {
				t.Fatalf("precopy %d copied the host's file through a symlink the sandbox made", i)
			}
			if sz, _ := unix.Lgetxattr(p, "user.secret", nil); sz > 0 {
				t.Fatalf("precopy %d copied the host file's attributes", i)
			}
		}
	}
}

// TestLayerBytesLayerSwapped: the OS-layer bound's count walks a running
// sandbox's layer, which may swap a directory for a symlink to a host
// directory back and forth: the count never includes the host's files.
func TestLayerBytesLayerSwapped(t *testing.T) {
	base := t.TempDir()
	upper, host := filepath.Join(base, upperDir), filepath.Join(base, "host")
	for _, d := range []string{filepath.Join(upper, "d", "e"), host} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(host, "big"), make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	swapDir(t, filepath.Join(upper, "d"), host)
	in := &instance{dir: base}
	for i := range 5000 {
		n, err := in.LayerBytes(1 << 40)
		if err != nil {
			t.Fatal(err)
		}
		if n >= 8<<20 {
			t.Fatalf("count %d: %d bytes, the host's file counted through the sandbox's symlink", i, n)
		}
		if n <= 0 {
			t.Fatalf("count %d: %d bytes, not even the layer's own directory", i, n)
		}
	}
}

// linkToBound links p into dir under new names until the file system
// refuses one more (the link count's bound), and returns those names.
func linkToBound(t *testing.T, p, dir string) []string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := 0; ; i++ {
		n := filepath.Join(dir, strconv.Itoa(i))
		err := unix.Link(p, n)
		if errors.Is(err, unix.EMLINK) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		if i == 200000 {
			t.Skipf("the file system of %s takes more than %d links to a file: no bound to reach", dir, i)
		}
		names = append(names, n)
	}
}

// TestCopyAtLinkBound: a hard-linked file whose earlier copy is at the
// link count's bound (as many snapshots and forks linking it make it)
// is copied again, and its next name linked to that copy. The copy went
// on in process (before, the EMLINK made it give the whole layer to
// cp -a: every file copied again, and no index for the next snapshot).
func TestCopyAtLinkBound(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	src := filepath.Join(base, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("shared"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "a"), filepath.Join(src, "b")); err != nil {
		t.Fatal(err)
	}
	settle(t, src)
	c1 := filepath.Join(base, "c1")
	x1, err := copyLayerIndexed(ctx, src, c1, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first copy one link short of the bound: the next copy links
	// one name to it and finds it full for the other.
	extra := linkToBound(t, filepath.Join(c1, "a"), filepath.Join(base, "links"))
	if err := os.Remove(extra[len(extra)-1]); err != nil {
		t.Fatal(err)
	}
	c2 := filepath.Join(base, "c2")
	if _, err := copyLayerIndexed(ctx, src, c2, x1); err != nil {
		t.Fatalf("a copy with a file at the link bound: %v", err)
	}
	sameContent(t, src, c2)
	first, a, b := inode(t, filepath.Join(c1, "a")), inode(t, filepath.Join(c2, "a")), inode(t, filepath.Join(c2, "b"))
	if a == b || (a != first && b != first) {
		t.Fatalf("want one name linked to the first copy (inode %d) and the other copied anew: inodes %d and %d", first, a, b)
	}
}
