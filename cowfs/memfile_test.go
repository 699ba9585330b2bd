package cowfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// overlayFiles lists the branch's overlay files on the host disk.
func overlayFileNames(t *testing.T, f *FS, branch string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(f.branchDir(branch), "overlay"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func mustRead(t *testing.T, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: read %d bytes, want %d (first difference at %d)", p, len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Small files written in a branch keep their bytes in memory, not in
// overlay files; a commit stores them and frees the memory.
func TestSmallFilesInMemory(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"seed": "x"})
	want := map[string][]byte{}
	for i := range 100 {
		name := fmt.Sprintf("f%03d", i)
		want[name] = pattern(uint64(i), 100+i*300)
		if err := os.WriteFile(filepath.Join(m.Dir(), name), want[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if names := overlayFileNames(t, f, "main"); len(names) != 0 {
		t.Errorf("small files made %d overlay files on disk: %v", len(names), names[:min(5, len(names))])
	}
	if f.memInUse() == 0 {
		t.Error("no file bytes in memory after writing 100 small files")
	}
	for name, w := range want {
		mustRead(t, filepath.Join(m.Dir(), name), w)
	}
	if _, err := f.Snapshot(context.Background(), "main"); err != nil {
		t.Fatal(err)
	}
	if n := f.memInUse(); n != 0 {
		t.Errorf("%d bytes still in memory after the snapshot stored every file", n)
	}
	for name, w := range want {
		mustRead(t, filepath.Join(m.Dir(), name), w)
	}
	// Another mount of the branch sees what the snapshot stored.
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	m2, err := f.Mount(context.Background(), "main", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Unmount()
	for name, w := range want {
		mustRead(t, filepath.Join(m2.Dir(), name), w)
	}
}

// A file stays in memory up to memFileMax bytes; a byte written past that
// moves everything written into an overlay file, and a write that starts
// past it never uses memory.
func TestMemFileMovesToOverlayAtEdge(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"base": string(pattern(1, 200<<10))})
	p := filepath.Join(m.Dir(), "edge")
	full := pattern(2, memFileMax+1)
	if err := os.WriteFile(p, full[:memFileMax], 0o644); err != nil {
		t.Fatal(err)
	}
	if names := overlayFileNames(t, f, "main"); len(names) != 0 {
		t.Fatalf("a file of exactly %d bytes made overlay files %v", memFileMax, names)
	}
	if got := f.memInUse(); got != memFileMax {
		t.Fatalf("%d bytes in memory, want %d", got, memFileMax)
	}
	mustRead(t, p, full[:memFileMax])
	fh, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt(full[memFileMax:], memFileMax); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	if names := overlayFileNames(t, f, "main"); len(names) != 1 {
		t.Fatalf("after a write past %d bytes: overlay files %v, want one", memFileMax, names)
	}
	if n := f.memInUse(); n != 0 {
		t.Fatalf("%d bytes still in memory after the file moved to its overlay", n)
	}
	mustRead(t, p, full)

	// A stored file changed in its first bytes keeps the change in memory;
	// the rest still comes from its chunks.
	base := pattern(1, 200<<10)
	bp := filepath.Join(m.Dir(), "base")
	fh, err = os.OpenFile(bp, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fh.WriteAt([]byte("HEAD"), 10)
	copy(base[10:], "HEAD")
	fh.Close()
	if names := overlayFileNames(t, f, "main"); len(names) != 1 {
		t.Fatalf("a small change of a large stored file made overlay files %v", names)
	}
	mustRead(t, bp, base)
	// Truncating it into its first bytes keeps the cut chunk's head in
	// memory too, and the bytes past the cut read as zeros once it grows.
	if err := os.Truncate(bp, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(bp, 3000); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, base[:1000]...), make([]byte, 2000)...)
	mustRead(t, bp, want)
	if names := overlayFileNames(t, f, "main"); len(names) != 1 {
		t.Fatalf("truncate of a stored file made overlay files %v", names)
	}
	// A hole punched in memory reads as zeros.
	fh, err = os.OpenFile(bp, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fallocate(int(fh.Fd()), 0x01|0x02, 100, 200); err != nil { // KEEP_SIZE|PUNCH_HOLE
		t.Fatal(err)
	}
	fh.Close()
	clear(want[100:300])
	mustRead(t, bp, want)

	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n := f.memInUse(); n != 0 {
		t.Fatalf("%d bytes in memory after unmount", n)
	}
	m2, err := f.Mount(context.Background(), "main", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Unmount()
	mustRead(t, filepath.Join(m2.Dir(), "edge"), full)
	mustRead(t, filepath.Join(m2.Dir(), "base"), want)
}

// Writers filling one file in blocks, in memory and then past the edge,
// while readers read it: every block a reader sees is all zeros or all
// its writer's bytes, and the file ends whole. Both go around the page
// cache (O_DIRECT), so that every read and write is a request the server
// answers: a buffered read copies from a page while a buffered write
// copies into it, on any Linux file system, and sees it torn at 64-byte
// steps (about 1 run in 40 here did).
func TestMemFileConcurrentWritersReaders(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"seed": "x"})
	p := filepath.Join(m.Dir(), "shared")
	const block, blocks = 4096, 2 * memFileMax / 4096
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	blockData := func(i int) []byte { return bytes.Repeat([]byte{byte(i + 1)}, block) }
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fh, err := os.OpenFile(p, os.O_WRONLY|syscall.O_DIRECT, 0)
			if err != nil {
				errs <- err
				return
			}
			defer fh.Close()
			for i := w; i < blocks; i += 4 {
				if _, err := fh.WriteAt(blockData(i), int64(i*block)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var rg sync.WaitGroup
	for range 2 {
		rg.Add(1)
		go func() {
			defer rg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				fh, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0)
				if err != nil {
					errs <- err
					return
				}
				buf := make([]byte, blocks*block)
				n, _ := fh.ReadAt(buf, 0)
				fh.Close()
				for i := 0; i+block <= n; i += block {
					b := buf[i : i+block]
					if !bytes.Equal(b, make([]byte, block)) && !bytes.Equal(b, blockData(i/block)) {
						errs <- fmt.Errorf("block %d read torn or wrong", i/block)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var want []byte
	for i := range blocks {
		want = append(want, blockData(i)...)
	}
	// The kernel's page cache may answer from what it saw; drop it by
	// reading through a fresh mount after the commit.
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n := f.memInUse(); n != 0 {
		t.Fatalf("%d bytes in memory after unmount", n)
	}
	m2, err := f.Mount(context.Background(), "main", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Unmount()
	mustRead(t, filepath.Join(m2.Dir(), "shared"), want)
}

// The branch's and the FS's budgets bound the bytes in memory; files
// that do not fit go to overlay files and read back the same.
func TestMemFileBudget(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFSWith(t, &Options{BranchMemBytes: 16 << 10, MemBytes: 24 << 10})
	m1, snap := mountNew(t, f, "one", map[string]string{"seed": "x"})
	if err := f.Branch(ctx, snap, "two"); err != nil {
		t.Fatal(err)
	}
	m2, err := f.Mount(ctx, "two", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Unmount()
	const files = 10
	data := func(i int) []byte { return pattern(uint64(i), 4000) }
	for i := range files {
		if err := os.WriteFile(filepath.Join(m1.Dir(), fmt.Sprint(i)), data(i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.memInUse(); got != 16<<10 {
		t.Errorf("branch one holds %d bytes in memory, want its budget %d", got, 16<<10)
	}
	if n := len(overlayFileNames(t, f, "one")); n != files-4 {
		t.Errorf("branch one has %d overlay files, want %d (4 files of 4 KiB fit in 16 KiB)", n, files-4)
	}
	for i := range files {
		if err := os.WriteFile(filepath.Join(m2.Dir(), fmt.Sprint(i)), data(100+i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.memInUse(); got != 24<<10 {
		t.Errorf("the FS holds %d bytes in memory, want its budget %d", got, 24<<10)
	}
	if n := len(overlayFileNames(t, f, "two")); n != files-2 {
		t.Errorf("branch two has %d overlay files, want %d (the FS budget leaves it 8 KiB)", n, files-2)
	}
	for i := range files {
		mustRead(t, filepath.Join(m1.Dir(), fmt.Sprint(i)), data(i))
		mustRead(t, filepath.Join(m2.Dir(), fmt.Sprint(i)), data(100+i))
	}
	// Memory freed by a commit is used again.
	if _, err := f.Snapshot(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if got := f.memInUse(); got != 8<<10 {
		t.Errorf("after branch one's commit %d bytes in memory, want branch two's 8 KiB", got)
	}
	if err := os.WriteFile(filepath.Join(m1.Dir(), "again"), data(50), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := f.memInUse(); got != 12<<10 {
		t.Errorf("after a new file %d bytes in memory, want 12 KiB", got)
	}
	if err := m1.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := m2.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n := f.memInUse(); n != 0 {
		t.Errorf("%d bytes in memory after every unmount", n)
	}

	// With memory turned off, every written file has an overlay file.
	g := openTestFSWith(t, &Options{MemBytes: -1})
	m3, _ := mountNew(t, g, "main", map[string]string{"seed": "x"})
	os.WriteFile(filepath.Join(m3.Dir(), "a"), []byte("a"), 0o644)
	if n := len(overlayFileNames(t, g, "main")); n != 1 || g.memInUse() != 0 {
		t.Errorf("memory off: %d overlay files, %d bytes in memory; want 1 and 0", n, g.memInUse())
	}
}

// An unlinked file that is still open keeps its in-memory bytes until
// the last close; a rollback and an unmount free them all.
func TestMemFileUnlinkRollbackUnmount(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, snap := mountNew(t, f, "main", map[string]string{"seed": "x"})
	p := filepath.Join(m.Dir(), "gone")
	fh, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	want := pattern(5, 5000)
	fh.Write(want)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := fh.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read of the unlinked open file: %v, equal %v", err, bytes.Equal(got, want))
	}
	if f.memInUse() == 0 {
		t.Fatal("the open unlinked file lost its bytes")
	}
	fh.Close()
	waitFor(t, "the last close frees the unlinked file's bytes", func() bool { return f.memInUse() == 0 })

	// Rollback drops written bytes of closed files, and of open ones at
	// their last close.
	os.WriteFile(filepath.Join(m.Dir(), "closed"), want, 0o644)
	open, err := os.Create(filepath.Join(m.Dir(), "open"))
	if err != nil {
		t.Fatal(err)
	}
	open.Write(want)
	if err := f.Rollback(ctx, "main", snap); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(m.Dir(), "closed")); !os.IsNotExist(err) {
		t.Fatalf("after rollback: stat closed: %v, want not exist", err)
	}
	open.Close()
	waitFor(t, "rollback and the last close free every byte", func() bool { return f.memInUse() == 0 })

	// Unmount frees the bytes of files written and of files still open.
	os.WriteFile(filepath.Join(m.Dir(), "w"), want, 0o644)
	held, err := os.Create(filepath.Join(m.Dir(), "held"))
	if err != nil {
		t.Fatal(err)
	}
	held.Write(want)
	os.Remove(filepath.Join(m.Dir(), "held"))
	if f.memInUse() == 0 {
		t.Fatal("nothing in memory before unmount")
	}
	held.Close() // its release may still be on its way at unmount
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n := f.memInUse(); n != 0 {
		t.Errorf("%d bytes in memory after unmount", n)
	}
}

// waitFor polls cond for up to 5 s (the kernel sends a release after
// close returns).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
