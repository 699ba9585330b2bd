package cowfs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// remount unmounts m and mounts its branch again at a fresh directory.
func remount(t *testing.T, f *FS, m *Mount) *Mount {
	t.Helper()
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	m2, err := f.Mount(context.Background(), m.Branch(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Unmount() })
	return m2
}

func TestMountTwiceIsRefused(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	mountNew(t, f, "main", map[string]string{"a": "a"})
	_, err := f.Mount(context.Background(), "main", t.TempDir(), nil)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("second mount: %v, want ErrBusy", err)
	}
	// The lock file refuses another holder too (as another process would).
	if _, err := lockFile(filepath.Join(f.branchDir("main"), "lock")); !errors.Is(err, ErrBusy) {
		t.Fatalf("lock while mounted: %v, want ErrBusy", err)
	}
}

func TestQuota(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"a": "a"})
	if err := f.SetQuota(ctx, "main", 1<<20); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(m.Dir(), &st); err != nil {
		t.Fatal(err)
	}
	if got := st.Blocks * uint64(st.Bsize); got != 1<<20 {
		t.Errorf("statfs size %d, want the quota %d", got, 1<<20)
	}
	fh, err := os.Create(filepath.Join(m.Dir(), "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	chunk := make([]byte, 256<<10)
	var werr error
	written := 0
	for i := 0; i < 8 && werr == nil; i++ {
		var n int
		n, werr = fh.Write(chunk)
		written += n
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing past the quota: %v, want ENOSPC", werr)
	}
	if written > 1<<20 {
		t.Errorf("wrote %d bytes under a %d quota", written, 1<<20)
	}
}

func TestAttributesAndLinksSurviveRemount(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"d1/f": "content", "d2/": ""})
	dir := m.Dir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Link(filepath.Join(dir, "d1/f"), filepath.Join(dir, "d2/g")))
	must(unix.Setxattr(filepath.Join(dir, "d1/f"), "user.k", []byte("v"), 0))
	must(os.Chmod(filepath.Join(dir, "d1/f"), 0o640))
	must(os.Chown(filepath.Join(dir, "d1/f"), 1234, 5678))
	must(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	must(unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	ts := []unix.Timespec{{Sec: 1000, Nsec: 5}, {Sec: 2000, Nsec: 7}}
	must(unix.UtimesNano(filepath.Join(dir, "d2"), ts))
	// A sparse file past 4 GiB.
	sp, err := os.Create(filepath.Join(dir, "sparse"))
	must(err)
	_, err = sp.WriteAt([]byte("end"), 5<<30)
	must(err)
	must(sp.Close())

	m = remount(t, f, m)
	dir = m.Dir()
	// The hard link is one inode again: a write through one name shows
	// through the other, also after a further remount.
	must(os.WriteFile(filepath.Join(dir, "d2/g"), []byte("changed"), 0o640))
	m = remount(t, f, m)
	dir = m.Dir()
	got, err := os.ReadFile(filepath.Join(dir, "d1/f"))
	if err != nil || string(got) != "changed" {
		t.Errorf("d1/f = %q, %v; want the write made through d2/g", got, err)
	}
	var st unix.Stat_t
	must(unix.Stat(filepath.Join(dir, "d1/f"), &st))
	if st.Nlink != 2 || st.Mode&0o7777 != 0o640 || st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("d1/f: nlink %d mode %o uid %d gid %d", st.Nlink, st.Mode&0o7777, st.Uid, st.Gid)
	}
	var st2 unix.Stat_t
	must(unix.Stat(filepath.Join(dir, "d2/g"), &st2))
	if st2.Ino != st.Ino {
		t.Errorf("d1/f and d2/g have inodes %d and %d", st.Ino, st2.Ino)
	}
	buf := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(dir, "d1/f"), "user.k", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("xattr user.k = %q, %v", buf[:n], err)
	}
	must(unix.Lstat(filepath.Join(dir, "fifo"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo has mode %o", st.Mode)
	}
	must(unix.Lstat(filepath.Join(dir, "null"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(1, 3) {
		t.Errorf("null: mode %o rdev %x", st.Mode, st.Rdev)
	}
	must(unix.Stat(filepath.Join(dir, "d2"), &st))
	if st.Mtim.Sec != 2000 || st.Mtim.Nsec != 7 {
		t.Errorf("d2 mtime %v, want 2000.000000007", st.Mtim)
	}
	must(unix.Stat(filepath.Join(dir, "sparse"), &st))
	if st.Size != 5<<30+3 {
		t.Errorf("sparse size %d", st.Size)
	}
	sp, err = os.Open(filepath.Join(dir, "sparse"))
	must(err)
	defer sp.Close()
	b := make([]byte, 6)
	if _, err := sp.ReadAt(b, 5<<30-3); err != nil || !bytes.Equal(b, []byte("\x00\x00\x00end")) {
		t.Errorf("sparse tail = %q, %v", b, err)
	}
	if st := f.Store().Stats(); st.UniqueBytes > 1<<20 {
		t.Errorf("a 5 GiB sparse file took %d chunk bytes", st.UniqueBytes)
	}
}

func TestMmapWrite(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"m": string(bytes.Repeat([]byte("."), 8192))})
	p := filepath.Join(m.Dir(), "m")
	fh, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := mapWrite(int(fh.Fd()), unix.MAP_SHARED, 8192, 4096, []byte("mapped")); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	m = remount(t, f, m)
	got, err := os.ReadFile(filepath.Join(m.Dir(), "m"))
	if err != nil || string(got[4096:4102]) != "mapped" || got[0] != '.' {
		t.Errorf("after mmap write and remount: %q, %v", got[4090:4110], err)
	}
}

func TestPermissionsEnforced(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"secret": "s", "open": "o"})
	os.Chmod(src, 0o755)
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Branch(ctx, snap, "main"); err != nil {
		t.Fatal(err)
	}
	// A mount point every user can reach.
	mnt, err := os.MkdirTemp("", "cowfs-perm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(mnt)
	os.Chmod(mnt, 0o755)
	m, err := f.Mount(ctx, "main", mnt, &MountOptions{AllowOther: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmount()
	os.Chmod(filepath.Join(m.Dir(), "secret"), 0o600)
	os.Chmod(filepath.Join(m.Dir(), "open"), 0o644)
	cat := func(name string) error {
		cmd := exec.Command("cat", filepath.Join(m.Dir(), name))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		return cmd.Run()
	}
	if err := cat("open"); err != nil {
		t.Errorf("nobody cannot read a 0644 file: %v", err)
	}
	if err := cat("secret"); err == nil {
		t.Error("nobody read a 0600 root file")
	}
}

func TestPassthroughCache(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	data := pattern(8, 1<<20)
	m, _ := mountNew(t, f, "main", map[string]string{"f": string(data)})
	p := filepath.Join(m.Dir(), "f")
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read: %v", err)
	}
	cached, _ := filepath.Glob(filepath.Join(f.Root(), "cache", "*"))
	if len(cached) != 1 {
		t.Fatalf("cache holds %d files after reading one unchanged file, want 1", len(cached))
	}
	// While a passthrough reader is open, a writable open is refused
	// (ADR 0052); once it is closed, new opens see the change.
	rd, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("new"), 0o644); !errors.Is(err, syscall.ETXTBSY) {
		t.Errorf("open for writing while a passthrough reader is open: %v, want ETXTBSY", err)
	}
	if got, err := io.ReadAll(rd); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the passthrough reader after a refused writer: %d bytes, %v", len(got), err)
	}
	rd.Close()
	if err := os.WriteFile(p, []byte("new"), 0o644); err != nil {
		t.Fatalf("open for writing once the passthrough reader is closed: %v", err)
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != "new" {
		t.Errorf("after rewrite: %q, %v", got, err)
	}
	if err := f.PruneCache(); err != nil {
		t.Fatal(err)
	}
	if cached, _ := filepath.Glob(filepath.Join(f.Root(), "cache", "*")); len(cached) != 0 {
		t.Errorf("cache not empty after prune: %v", cached)
	}
}

func TestRollbackWhileMounted(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"keep": "k", "d/inner": "i"})
	dir := m.Dir()
	if err := os.WriteFile(filepath.Join(dir, "x"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	withX, err := f.Snapshot(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Rollback(ctx, "main", base); err != nil {
		t.Fatal(err)
	}
	// The kernel now caches "x" as missing.
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Fatalf("x after rollback to base: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "d/missing")); !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := f.Rollback(ctx, "main", withX); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "x")); err != nil || string(got) != "x" {
		t.Errorf("x right after rollback to a snapshot holding it: %q, %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "d/inner")); err != nil || string(got) != "i" {
		t.Errorf("d/inner: %q, %v", got, err)
	}
}

func TestSeekDataHole(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"a": "a"})
	p := filepath.Join(m.Dir(), "sparse")
	fh, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	fh.WriteAt(bytes.Repeat([]byte("x"), 4096), 1<<20)
	fh.WriteAt([]byte("y"), 8<<20)
	fh.Close()
	check := func(stage string) {
		fh, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		fd := int(fh.Fd())
		for _, c := range []struct {
			off    int64
			whence int
			want   int64
		}{
			{0, unix.SEEK_DATA, 1 << 20},
			{1<<20 + 10, unix.SEEK_HOLE, 1<<20 + 4096},
			{2 << 20, unix.SEEK_DATA, 8 << 20},
			{8 << 20, unix.SEEK_HOLE, 8<<20 + 1},
			{0, unix.SEEK_HOLE, 0},
		} {
			got, err := unix.Seek(fd, c.off, c.whence)
			// A stored chunk may hold zeros around the written bytes:
			// data may start earlier and end later than written, never
			// the other way round.
			ok := err == nil && ((c.whence == unix.SEEK_DATA && got <= c.want && got >= c.off) ||
				(c.whence == unix.SEEK_HOLE && got >= c.want))
			if !ok {
				t.Errorf("%s: lseek(%d, %d) = %d, %v; want %d", stage, c.off, c.whence, got, err, c.want)
			}
		}
		if _, err := unix.Seek(fd, 9<<20, unix.SEEK_DATA); err != unix.ENXIO {
			t.Errorf("%s: SEEK_DATA past the end: %v, want ENXIO", stage, err)
		}
	}
	check("written")
	m = remount(t, f, m)
	p = filepath.Join(m.Dir(), "sparse")
	check("committed")
}

// TestQuotaBoundsGrowth: under a 1 MiB quota, growing a file by truncate
// or fallocate, making names and setting xattrs are all charged and
// refused with ENOSPC once the quota is spent.
func TestQuotaBoundsGrowth(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"a": "a"})
	if err := f.SetQuota(ctx, "main", 1<<20); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(m.Dir(), "a")
	if err := os.Truncate(p, 50<<30); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("truncate to 50 GiB: %v, want ENOSPC", err)
	}
	fh, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(fh.Fd()), 0, 0, 50<<30); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("fallocate of 50 GiB: %v, want ENOSPC", err)
	}
	fh.Close()
	if st, _ := os.Stat(p); st.Size() != 1 {
		t.Errorf("size after refused growth: %d, want 1", st.Size())
	}
	names := 0
	for ; names < 1<<20; names++ {
		if err := os.Mkdir(filepath.Join(m.Dir(), fmt.Sprintf("d%d", names)), 0o755); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("mkdir %d: %v, want ENOSPC", names, err)
			}
			break
		}
	}
	if names > (1<<20)/entryOverhead {
		t.Errorf("%d names made under a 1 MiB quota, want at most %d", names, (1<<20)/entryOverhead)
	}
	if err := f.SetQuota(ctx, "main", 0); err != nil {
		t.Fatal(err)
	}
	bs, _, _ := f.List(ctx)
	if err := f.SetQuota(ctx, "main", bs[0].UsedBytes+100<<10); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 60<<10)
	if err := unix.Setxattr(p, "user.a", big, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "user.b", big, 0); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("xattr past the quota: %v, want ENOSPC", err)
	}
}

// TestQuotaSavedWithEachCommit: the bytes charged reach the branch meta
// file with the commit (fsync), not only at unmount, so a crash of the
// mount does not forget them.
func TestQuotaSavedWithEachCommit(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"a": "a"})
	if err := f.SetQuota(ctx, "main", 10<<20); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(m.Dir(), "data")
	if err := os.WriteFile(p, make([]byte, 100<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	fsyncPath(t, p)
	meta, err := f.readMeta("main") // the file as a crash would leave it
	if err != nil {
		t.Fatal(err)
	}
	if meta.UsedBytes < 100<<10 {
		t.Errorf("meta file after fsync holds %d bytes used, want at least %d", meta.UsedBytes, 100<<10)
	}
}

// TestPunchHoleWritesNoZeros: punching 64 MiB out of a file stores no
// zeros, charges nothing and leaves a hole that reads as zeros.
func TestPunchHoleWritesNoZeros(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"a": "a"})
	p := filepath.Join(m.Dir(), "sparse")
	fh, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB of data
	for _, off := range []int64{0, 63 << 20} {
		if _, err := fh.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	// Head stores the written bytes (an fsync could leave them in the
	// fsync log, for the punch to store).
	if _, err := f.Head(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	bs, _, _ := f.List(ctx)
	if err := f.SetQuota(ctx, "main", bs[0].UsedBytes+1<<20); err != nil {
		t.Fatal(err)
	}
	before := f.Store().Stats().LogicalBytes
	if err := unix.Fallocate(int(fh.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 100, 64<<20-200); err != nil {
		t.Fatalf("punch: %v", err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
	if grew := f.Store().Stats().LogicalBytes - before; grew > 1<<20 {
		t.Errorf("punching stored %d bytes, want under 1 MiB", grew)
	}
	got := make([]byte, 64<<20)
	if _, err := fh.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:100], data[:100]) || !bytes.Equal(got[64<<20-100:], data[1<<20-100:]) {
		t.Error("the bytes around the hole changed")
	}
	if i := bytes.IndexFunc(got[100:64<<20-100], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("byte %d of the hole is not zero", 100+i)
	}
}

// TestVerifyReportsDamage: trees that do not decode or do not add up are
// reported with their path and object id.
func TestVerifyReportsDamage(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	s := f.Store()
	// A file object that holds other than its entry says.
	chunk, err := s.Put([]byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	l, pl := encodeFileLeaf([]fileRef{{ID: chunk, Size: 5}, {Size: 1 << 50}})
	fileID, err := s.PutNode(l, pl)
	if err != nil {
		t.Fatal(err)
	}
	// A directory with more xattrs on one entry than the limits allow,
	// encoded by hand as a damaged or foreign store could hold it.
	var xs []Xattr
	for i := range maxXattrs + 1 {
		xs = append(xs, Xattr{Name: fmt.Sprintf("user.%05d", i)})
	}
	bad := Entry{Name: "x", Type: TypeFile, Xattrs: xs}
	e := bad
	e.Xattrs = nil
	_, good, err := encodeDir([]Entry{e})
	if err != nil {
		t.Fatal(err)
	}
	cut := len(good) - 1 // the xattr count, zero
	payload := binary.AppendUvarint(append([]byte{}, good[:cut]...), uint64(len(xs)))
	for _, x := range xs {
		payload = appendString(appendString(payload, x.Name), "")
	}
	badDir, err := s.PutNode(nil, payload)
	if err != nil {
		t.Fatal(err)
	}
	top, err := putDir(s, []Entry{
		{Name: "bad", Type: TypeDir, ID: badDir},
		{Name: "f", Type: TypeFile, ID: fileID, Size: 5},
	})
	if err != nil {
		t.Fatal(err)
	}
	root, err := putRoot(s, Entry{Type: TypeDir, ID: top, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.keepSnapshot(root); err != nil {
		t.Fatal(err)
	}
	var got []Problem
	st, err := f.Verify(ctx, func(p Problem) { got = append(got, p) })
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]chunkstore.ID{"/bad/": badDir, "/f": fileID}
	for _, p := range got {
		if want[p.Path] != p.ID {
			t.Errorf("unexpected problem %v", p)
		}
		delete(want, p.Path)
	}
	if len(want) > 0 {
		t.Errorf("problems not reported at %v (stats %+v)", want, st)
	}
}

// TestTruncateSameSizeSetsTimes: a truncation that leaves the size as it
// is (ftruncate to the size, O_TRUNC of an empty file) still sets mtime
// and ctime to now, as Linux file systems do: make decides on them.
func TestTruncateSameSizeSetsTimes(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"three": "abc", "empty": ""})
	old := time.Unix(1000, 0)
	for _, c := range []struct {
		name string
		op   func(p string) error
	}{
		{"three", func(p string) error { return os.Truncate(p, 3) }},
		{"empty", func(p string) error {
			fh, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
			if err == nil {
				err = fh.Close()
			}
			return err
		}},
	} {
		p := filepath.Join(m.Dir(), c.name)
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
		before := time.Now().Add(-time.Second)
		if err := c.op(p); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if mt := time.Unix(st.Mtim.Unix()); mt.Before(before) {
			t.Errorf("%s: mtime %v after a truncation to its size, want now", c.name, mt)
		}
		if ct := time.Unix(st.Ctim.Unix()); ct.Before(before) {
			t.Errorf("%s: ctime %v after a truncation to its size, want now", c.name, ct)
		}
	}
}

// TestStatfsWithoutQuota: a branch with no quota reports the size and
// free space of the disk that holds the store, not a made-up petabyte,
// so that programs that check for space before writing are told the
// truth.
func TestStatfsWithoutQuota(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"a": "a"})
	var mnt, disk unix.Statfs_t
	if err := unix.Statfs(m.Dir(), &mnt); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(f.Root(), &disk); err != nil {
		t.Fatal(err)
	}
	gotTotal, wantTotal := mnt.Blocks*uint64(mnt.Bsize), disk.Blocks*uint64(disk.Bsize)
	gotFree, wantFree := mnt.Bavail*uint64(mnt.Bsize), disk.Bavail*uint64(disk.Bsize)
	if gotTotal > wantTotal || gotTotal < wantTotal-wantTotal/100 {
		t.Errorf("statfs size %d, the store's disk %d", gotTotal, wantTotal)
	}
	if diff := int64(gotFree) - int64(wantFree); diff > 64<<20 || diff < -64<<20 {
		t.Errorf("statfs free %d, the store's disk %d", gotFree, wantFree)
	}
}
