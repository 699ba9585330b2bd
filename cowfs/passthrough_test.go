package cowfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The passthrough cache holds one file per content id, shared by every
// branch: no open through a mount may be able to change it. These tests
// open a file read-only (served by passthrough from the cache), then try
// every way to write through the same file, and check that the other
// branch and the cache still hold the original bytes.

// twoBranches mounts branches "a" and "b" forked from one snapshot holding
// file "f" with content data.
func twoBranches(t *testing.T, f *FS, data []byte) (a, b *Mount) {
	t.Helper()
	a, snap := mountNew(t, f, "a", map[string]string{"f": string(data)})
	ctx := context.Background()
	if err := f.Branch(ctx, snap, "b"); err != nil {
		t.Fatal(err)
	}
	b, err := f.Mount(ctx, "b", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Unmount() })
	return a, b
}

// checkShared fails t unless cache, the cache file of data that
// passthrough reads use in every branch, and file "f" as mount b reads
// it hold data.
func checkShared(t *testing.T, cache string, b *Mount, data []byte, what string) {
	t.Helper()
	if got, err := os.ReadFile(cache); err != nil || !bytes.Equal(got, data) {
		t.Errorf("%s: the shared cache file changed: %s, %v", what, diff(got, data), err)
	}
	if got, err := os.ReadFile(filepath.Join(b.Dir(), "f")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("%s: the other branch's read %s, %v", what, diff(got, data), err)
	}
}

func head(b []byte) []byte { return b[:min(len(b), 24)] }

// diff describes where got first differs from want.
func diff(got, want []byte) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("differs at %d: %q, want %q", i, head(got[i:]), head(want[i:]))
		}
	}
	return fmt.Sprintf("%d bytes, want %d", len(got), len(want))
}

// openPassthrough opens file "f" of m read-only, checks that the open is
// served from the cache, and returns the cache file's path.
func openPassthrough(t *testing.T, f *FS, m *Mount) (*os.File, string) {
	t.Helper()
	rd, err := os.Open(filepath.Join(m.Dir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	cached, _ := filepath.Glob(filepath.Join(f.Root(), "cache", "*"))
	if len(cached) != 1 {
		t.Fatalf("read-only open of an unchanged file: cache holds %d files, want 1 (passthrough)", len(cached))
	}
	return rd, cached[0]
}

// mmapWrite maps fd shared and writable, copies b in at off and syncs,
// in a child process (mapWrite).
func mmapWrite(fd int, size int, off int, b []byte) error {
	return mapWrite(fd, unix.MAP_SHARED, size, off, b)
}

// TestPassthroughWriterMmapStaysPrivate: while branch a has the file open
// read-only through passthrough, a writable open of it in a and a shared
// writable mapping must not write into the cache file other branches
// read; a either keeps its write or is refused with an error.
func TestPassthroughWriterMmapStaysPrivate(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	data := pattern(3, 64<<10)
	a, b := twoBranches(t, f, data)
	p := filepath.Join(a.Dir(), "f")
	rd, cache := openPassthrough(t, f, a)
	mark := []byte("written-through-mmap")
	w, err := os.OpenFile(p, os.O_RDWR, 0)
	wrote := false
	if err != nil {
		if !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ETXTBSY) {
			t.Errorf("writable open while a passthrough reader is open: %v, want success, EINVAL or ETXTBSY", err)
		}
	} else {
		if err := mmapWrite(int(w.Fd()), len(data), 4096, mark); err != nil {
			t.Logf("writable shared mapping refused: %v", err)
		} else {
			wrote = true
		}
		w.Close()
	}
	checkShared(t, cache, b, data, "after a writable mapping in branch a")
	rd.Close()
	want := data
	if wrote {
		want = append([]byte(nil), data...)
		copy(want[4096:], mark)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Errorf("branch a's read (own write kept: %v) %s, %v", wrote, diff(got, want), err)
	}
	// With the reader gone, a writable mapping works as on any file.
	w, err = os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("writable open with no reader left: %v", err)
	}
	if err := mmapWrite(int(w.Fd()), len(data), 8192, mark); err != nil {
		t.Fatalf("writable mapping with no reader left: %v", err)
	}
	w.Close()
	want = append([]byte(nil), want...)
	copy(want[8192:], mark)
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Errorf("after a mapping with no reader left, branch a's read %s, %v", diff(got, want), err)
	}
	checkShared(t, cache, b, data, "after a writable mapping with no reader left")
}

// TestPassthroughReaderCannotWrite tries every way to write through a
// read-only passthrough open, or around it to the same cache file, and
// checks that the other branch and the cache still hold the original
// bytes.
func TestPassthroughReaderCannotWrite(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	data := pattern(4, 64<<10)
	a, b := twoBranches(t, f, data)
	p := filepath.Join(a.Dir(), "f")
	rd, cache := openPassthrough(t, f, a)
	fd := int(rd.Fd())
	mark := []byte("through-the-reader")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	// Each attempt must fail with one of the errnos listed.
	for _, c := range []struct {
		name string
		try  func() error
		want []syscall.Errno
	}{
		{"write", func() error { _, err := unix.Pwrite(fd, mark, 0); return err }, []syscall.Errno{syscall.EBADF}},
		{"fallocate", func() error { return unix.Fallocate(fd, 0, 0, 1<<20) }, []syscall.Errno{syscall.EBADF}},
		{"punch hole", func() error {
			return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096)
		}, []syscall.Errno{syscall.EBADF}},
		{"ftruncate", func() error { return unix.Ftruncate(fd, 0) }, []syscall.Errno{syscall.EINVAL, syscall.EBADF}},
		{"copy_file_range", func() error {
			_, err := unix.CopyFileRange(int(src.Fd()), nil, fd, nil, 4096, 0)
			return err
		}, []syscall.Errno{syscall.EBADF}},
		{"splice", func() error {
			if _, err := pw.Write(mark); err != nil {
				return err
			}
			_, err := unix.Splice(int(pr.Fd()), nil, fd, nil, len(mark), 0)
			return err
		}, []syscall.Errno{syscall.EBADF}},
		{"shared writable mmap", func() error { return mmapWrite(fd, len(data), 0, mark) }, []syscall.Errno{syscall.EACCES}},
		{"mprotect of a shared mapping", func() error {
			mem, err := unix.Mmap(fd, 0, len(data), unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				return err
			}
			defer unix.Munmap(mem)
			return unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE)
		}, []syscall.Errno{syscall.EACCES}},
		{"reopen through /proc read-write", func() error {
			w, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDWR, 0)
			if err == nil {
				w.Close()
			}
			return err
		}, []syscall.Errno{syscall.ETXTBSY}},
		{"open write-only with O_APPEND", func() error {
			w, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				w.Close()
			}
			return err
		}, []syscall.Errno{syscall.ETXTBSY}},
		{"open with O_TRUNC", func() error {
			w, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
			if err == nil {
				w.Close()
			}
			return err
		}, []syscall.Errno{syscall.ETXTBSY}},
		{"set the immutable flag", func() error {
			return unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, 0x10) // FS_IMMUTABLE_FL
		}, []syscall.Errno{syscall.ENOTTY, syscall.EBADF, syscall.EPERM, syscall.EINVAL, syscall.ENOSYS}},
	} {
		err := c.try()
		ok := false
		for _, w := range c.want {
			ok = ok || errors.Is(err, w)
		}
		if !ok {
			t.Errorf("%s through a read-only passthrough open: %v, want one of %v", c.name, err, c.want)
		}
		checkShared(t, cache, b, data, c.name)
	}
	// A private writable mapping copies pages for its process only.
	if err := mapWrite(fd, unix.MAP_PRIVATE, len(data), 0, mark); err != nil {
		t.Fatalf("private writable mapping of a read-only open: %v", err)
	}
	checkShared(t, cache, b, data, "private writable mapping")
	// O_RDONLY|O_TRUNC truncates on Linux; whatever cowfs does with it,
	// the cache and the other branch keep their bytes.
	if w, err := os.OpenFile(p, os.O_RDONLY|os.O_TRUNC, 0); err == nil {
		w.Close()
	}
	checkShared(t, cache, b, data, "open O_RDONLY|O_TRUNC")
	// truncate by path changes branch a's file, not the cache.
	if err := os.Truncate(p, 10); err != nil {
		t.Errorf("truncate by path while a passthrough reader is open: %v", err)
	}
	checkShared(t, cache, b, data, "truncate by path")
	if got, err := io.ReadAll(rd); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the passthrough reader: %s, %v", diff(got, data), err)
	}
	rd.Close()
	if st, err := os.Stat(p); err != nil || st.Size() != 10 {
		t.Errorf("branch a after truncate by path: %v, %v", st, err)
	}
}

// TestPassthroughSameContentOtherFile: another file with the same content
// in the same branch shares the cache file, not the inode; a writable
// mapping of it while the first file is open through passthrough goes to
// that file alone.
func TestPassthroughSameContentOtherFile(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	data := pattern(5, 64<<10)
	a, snap := mountNew(t, f, "a", map[string]string{"f": string(data), "g": string(data)})
	ctx := context.Background()
	if err := f.Branch(ctx, snap, "b"); err != nil {
		t.Fatal(err)
	}
	b, err := f.Mount(ctx, "b", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unmount()
	_, cache := openPassthrough(t, f, a)
	g := filepath.Join(a.Dir(), "g")
	rg, err := os.Open(g) // passthrough from the same cache file
	if err != nil {
		t.Fatal(err)
	}
	rg.Close()
	w, err := os.OpenFile(g, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("writable open of g, with f open through passthrough: %v", err)
	}
	mark := []byte("g-only")
	if err := mmapWrite(int(w.Fd()), len(data), 100, mark); err != nil {
		t.Fatal(err)
	}
	w.Close()
	checkShared(t, cache, b, data, "writable mapping of g")
	want := append([]byte(nil), data...)
	copy(want[100:], mark)
	if got, err := os.ReadFile(g); err != nil || !bytes.Equal(got, want) {
		t.Errorf("g after its writable mapping: %s, %v", diff(got, want), err)
	}
	if got, err := os.ReadFile(filepath.Join(a.Dir(), "f")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("f after g's writable mapping: %s, %v", diff(got, data), err)
	}
}

// TestPassthroughWriterAfterReaderCloses: a writable open right after
// the last passthrough reader closed may reach cowfs before that reader's
// release does. It must neither be refused nor get the cache file as its
// backing: its shared mapping writes the branch's file.
func TestPassthroughWriterAfterReaderCloses(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	data := pattern(6, 64<<10)
	a, b := twoBranches(t, f, data)
	p := filepath.Join(a.Dir(), "f")
	rd0, cache := openPassthrough(t, f, a)
	rd0.Close()
	want := append([]byte(nil), data...)
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	for i := range rounds {
		rd, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		if _, err := rd.Read(buf); err != nil {
			t.Fatal(err)
		}
		rd.Close()
		w, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("round %d: writable open right after the reader closed: %v", i, err)
		}
		mark := []byte(fmt.Sprintf("round-%03d", i))
		if err := mmapWrite(int(w.Fd()), len(data), 4096*(i%16), mark); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		w.Close()
		copy(want[4096*(i%16):], mark)
	}
	checkShared(t, cache, b, data, "after the rounds")
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Errorf("branch a after the rounds: %s, %v", diff(got, want), err)
	}
}

// TestCacheFilesOpenReadOnlyMount: the kernel reopens a passthrough
// backing file with each FUSE open's flags, without permission checks, so
// cache files reach it through a read-only mount: a writable reopen of
// one fails with EROFS whatever the FUSE server answered.
func TestCacheFilesOpenReadOnlyMount(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	data := pattern(7, 8192)
	a, _ := mountNew(t, f, "a", map[string]string{"f": string(data)})
	if _, err := os.Stat(filepath.Join(a.Dir(), "f")); err != nil { // loads the root
		t.Fatal(err)
	}
	b := a.b
	b.mu.Lock()
	in := b.root.children["f"]
	b.mu.Unlock()
	if in == nil {
		t.Fatal("no inode for f")
	}
	pt, err := f.cacheFile(context.Background(), in.id, in.size)
	if err != nil {
		t.Fatal(err)
	}
	defer pt.Close()
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(pt.Fd()), &sfs); err != nil || sfs.Flags&unix.ST_RDONLY == 0 {
		t.Errorf("cache file's mount flags %#x (%v): not read-only", sfs.Flags, err)
	}
	w, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", pt.Fd()), os.O_RDWR, 0)
	if err == nil {
		w.Close()
	}
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("writable reopen of a cache file handed to the kernel: %v, want EROFS", err)
	}
	if got, err := os.ReadFile(filepath.Join(f.Root(), "cache", in.id.String())); err != nil || !bytes.Equal(got, data) {
		t.Errorf("cache file: %s, %v", diff(got, data), err)
	}
}
