package treecopy

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// buildTree makes, in the new directory root, a tree with what a copy
// must keep.
func buildTree(t *testing.T, root string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, "a", "b", "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"emptydir", "a", "a/b"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.Chmod(filepath.Join(root, "emptydir"), 0o750)
	os.Chmod(filepath.Join(root, "a", "b"), 0o711)
	writeFile(t, filepath.Join(root, "exec"), "#!/bin/sh\necho hi\n", 0o755)
	writeFile(t, filepath.Join(root, "private"), "secret", 0o600)
	writeFile(t, filepath.Join(root, "empty"), "", 0o644)
	writeFile(t, filepath.Join(root, "a", "b", "c", "deep.txt"), "deep", 0o640)
	writeFile(t, filepath.Join(root, "new\nline"), "newline", 0o644)
	writeFile(t, filepath.Join(root, "bad\xff\xfe name"), "not utf-8", 0o644)
	writeFile(t, filepath.Join(root, strings.Repeat("n", 200)), "long name", 0o644)
	random := make([]byte, 1<<20)
	rand.Read(random)
	writeFile(t, filepath.Join(root, "random"), string(random), 0o644)
	f, err := os.Create(filepath.Join(root, "holey"))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("start"), 0)
	f.WriteAt([]byte("end"), 3<<20+5)
	f.Close()
	for l, target := range map[string]string{"rel": "a/b", "abs": "/etc/hostname", "dangling": "nowhere/at/all", "a/b/up": "../../exec"} {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	setTimes(t, root)
}

func TestRoundTrip(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	buildTree(t, filepath.Join(src, "tree"))
	data, ast := archiveDir(t, src, "tree")
	est, err := extractTo(t, data, dst, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	compareTrees(t, filepath.Join(src, "tree"), filepath.Join(dst, "tree"))
	want := Stats{Name: "tree", Files: 9, Dirs: 5, Symlinks: 4, Bytes: ast.Bytes}
	if ast != want || est != want {
		t.Errorf("stats: Archive %+v, Extract %+v, want %+v", ast, est, want)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "tree", "holey"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= st.Size {
		t.Errorf("holey: %d blocks for %d bytes: the hole was written out", st.Blocks, st.Size)
	}
	if got := listTemps(t, dst); got != nil {
		t.Errorf("temporaries left: %q", got)
	}
	// The names travel as PAX records, byte for byte.
	tr := tar.NewReader(bytes.NewReader(data))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if !slices.Contains(names, "tree/bad\xff\xfe name") || !slices.Contains(names, "tree/a/b/") || names[0] != "tree/" {
		t.Errorf("entry names: %q", names)
	}
	if !slices.IsSorted(names[1:4]) {
		t.Errorf("children not sorted: %q", names)
	}
}

func TestRoundTripRenamed(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	buildTree(t, filepath.Join(src, "tree"))
	data, _ := archiveDir(t, src, "tree")
	if _, err := extractTo(t, data, dst, "other", Options{}); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, filepath.Join(src, "tree"), filepath.Join(dst, "other"))
	if got := entries(t, dst); !slices.Equal(got, []string{"other"}) {
		t.Errorf("parent holds %q, want [other]", got)
	}
}

func TestArchiveSkipsSpecial(t *testing.T) {
	src := t.TempDir()
	top := filepath.Join(src, "top")
	os.Mkdir(top, 0o755)
	writeFile(t, filepath.Join(top, "file"), "x", 0o644)
	if err := unix.Mkfifo(filepath.Join(top, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(top, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	data, st := archiveDir(t, src, "top")
	if st.Skipped != 2 || st.Files != 1 || st.Dirs != 1 {
		t.Errorf("stats %+v, want 2 skipped, 1 file, 1 dir", st)
	}
	// The fifo goes as a header alone, so that the other side counts it;
	// a socket has no tar type.
	if got := tarNames(t, data); !slices.Equal(got, []string{"top/", "top/fifo", "top/file"}) {
		t.Errorf("entries %q", got)
	}
	est, err := extractTo(t, data, t.TempDir(), "", Options{})
	if err != nil || est.Skipped != 1 || est.Files != 1 {
		t.Errorf("extract: %+v %v, want the fifo skipped and counted", est, err)
	}
	fd := openDirFD(t, top)
	if _, err := Archive(context.Background(), io.Discard, fd, "fifo"); err == nil || !strings.Contains(err.Error(), "fifo") {
		t.Errorf("archiving a fifo as the top: %v, want an error naming a fifo", err)
	}
}

// tarNames lists the entries of a tar stream.
func tarNames(t *testing.T, data []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

func TestArchiveTopSymlinkAndFile(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	os.Mkdir(filepath.Join(src, "dir"), 0o755)
	writeFile(t, filepath.Join(src, "dir", "x"), "x", 0o644)
	os.Symlink("dir", filepath.Join(src, "link"))
	writeFile(t, filepath.Join(src, "file"), "content", 0o640)
	setTimes(t, src)

	data, st := archiveDir(t, src, "link")
	tr := tar.NewReader(bytes.NewReader(data))
	h, err := tr.Next()
	if err != nil || h.Typeflag != tar.TypeSymlink || h.Name != "link" || h.Linkname != "dir" {
		t.Fatalf("top symlink: %+v, %v", h, err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("more than one entry for a top symlink: %v", err)
	}
	if st != (Stats{Name: "link", Symlinks: 1}) {
		t.Errorf("stats %+v", st)
	}
	if _, err := extractTo(t, data, dst, "", Options{}); err != nil {
		t.Fatal(err)
	}

	data, st = archiveDir(t, src, "file")
	if got := tarNames(t, data); !slices.Equal(got, []string{"file"}) {
		t.Errorf("entries %q", got)
	}
	if st != (Stats{Name: "file", Files: 1, Bytes: 7}) {
		t.Errorf("stats %+v", st)
	}
	if _, err := extractTo(t, data, dst, "", Options{}); err != nil {
		t.Fatal(err)
	}
	a, b := snapshot(t, src), snapshot(t, dst)
	for _, k := range []string{"link", "file"} {
		if a[k] != b[k] {
			t.Errorf("%s: %+v, copy %+v", k, a[k], b[k])
		}
	}
}

func TestArchiveBadName(t *testing.T) {
	fd := openDirFD(t, t.TempDir())
	for _, name := range []string{"", ".", "..", "a/b", "/a", "a\x00"} {
		var buf bytes.Buffer
		if _, err := Archive(context.Background(), &buf, fd, name); err == nil {
			t.Errorf("Archive(%q): no error", name)
		}
		if buf.Len() != 0 {
			t.Errorf("Archive(%q) wrote %d bytes", name, buf.Len())
		}
	}
	if _, err := Archive(context.Background(), io.Discard, fd, "missing"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("Archive(missing): %v", err)
	}
}

// hookWriter calls hook on its first write.
type hookWriter struct {
	w    io.Writer
	hook func()
}

func (h *hookWriter) Write(p []byte) (int, error) {
	if h.hook != nil {
		h.hook()
		h.hook = nil
	}
	return h.w.Write(p)
}

func TestArchiveChangedWhileRead(t *testing.T) {
	src := t.TempDir()
	p := filepath.Join(src, "big")
	const size = 4 << 20
	fd := openDirFD(t, src)

	writeFile(t, p, strings.Repeat("a", size), 0o644)
	var buf bytes.Buffer
	w := &hookWriter{w: &buf, hook: func() { os.Truncate(p, 300<<10) }}
	_, err := Archive(context.Background(), w, fd, "big")
	if err == nil || !strings.Contains(err.Error(), "changed while it was read") || !strings.Contains(err.Error(), `"big"`) {
		t.Errorf("file shrunk while read: %v", err)
	}

	writeFile(t, p, strings.Repeat("a", size), 0o644)
	buf.Reset()
	w = &hookWriter{w: &buf, hook: func() {
		f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		f.Write(bytes.Repeat([]byte("b"), 1<<20))
		f.Close()
	}}
	if _, err := Archive(context.Background(), w, fd, "big"); err != nil {
		t.Fatalf("file grew while read: %v", err)
	}
	tr := tar.NewReader(&buf)
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(tr)
	if err != nil || h.Size != size || len(body) != size || strings.Contains(string(body), "b") {
		t.Errorf("grown file: header size %d, body %d bytes, %v", h.Size, len(body), err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("after the file: %v, want the end", err)
	}
}

// cancelWriter cancels a context once n bytes went through it.
type cancelWriter struct {
	n      int
	cancel func()
}

func (c *cancelWriter) Write(p []byte) (int, error) {
	c.n -= len(p)
	if c.n <= 0 {
		c.cancel()
	}
	return len(p), nil
}

func TestArchiveCancel(t *testing.T) {
	src := t.TempDir()
	buildTree(t, filepath.Join(src, "tree"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fd := openDirFD(t, src)
	_, err := Archive(ctx, &cancelWriter{n: 100 << 10, cancel: cancel}, fd, "tree")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Archive with a cancelled context: %v", err)
	}
}

// cancelReader cancels a context once n bytes were read from it.
type cancelReader struct {
	r      io.Reader
	n      int
	cancel func()
}

func (c *cancelReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.n -= n; c.n <= 0 {
		c.cancel()
	}
	return n, err
}

func TestExtractCancel(t *testing.T) {
	src := t.TempDir()
	buildTree(t, filepath.Join(src, "tree"))
	data, _ := archiveDir(t, src, "tree")
	for _, n := range []int{600, 300 << 10, len(data) - 1100} {
		dst := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		fd := openDirFD(t, dst)
		_, err := Extract(ctx, &cancelReader{r: bytes.NewReader(data), n: n, cancel: cancel}, fd, "", Options{})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled after %d bytes: %v", n, err)
		}
		if got := entries(t, dst); len(got) != 0 {
			t.Errorf("cancelled after %d bytes: left %q", n, got)
		}
	}
	// A file top too.
	writeFile(t, filepath.Join(src, "big"), strings.Repeat("x", 1<<20), 0o644)
	data, _ = archiveDir(t, src, "big")
	dst := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fd := openDirFD(t, dst)
	if _, err := Extract(ctx, &cancelReader{r: bytes.NewReader(data), n: 512 << 10, cancel: cancel}, fd, "", Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("file top cancelled: %v", err)
	}
	if got := entries(t, dst); len(got) != 0 {
		t.Errorf("file top cancelled: left %q", got)
	}
}

func TestExtractNewFileTop(t *testing.T) {
	dst := t.TempDir()
	data := makeTar(t, fileEnt("f", "hello", 0o640))
	st, err := extractTo(t, data, dst, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{Name: "f", Files: 1, Bytes: 5}) {
		t.Errorf("stats %+v", st)
	}
	if _, err := extractTo(t, data, dst, "g", Options{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"f", "g"} {
		b, err := os.ReadFile(filepath.Join(dst, n))
		fi, _ := os.Lstat(filepath.Join(dst, n))
		if err != nil || string(b) != "hello" || fi.Mode() != 0o640 || !fi.ModTime().Equal(time.Unix(1_500_000_000, 0)) {
			t.Errorf("%s: %q %v %v", n, b, fi.Mode(), err)
		}
	}
	if got := entries(t, dst); !slices.Equal(got, []string{"f", "g"}) {
		t.Errorf("parent holds %q", got)
	}
}

func TestExtractFileOverFile(t *testing.T) {
	dst := t.TempDir()
	writeFile(t, filepath.Join(dst, "f"), "old content, longer", 0o600)
	os.Symlink("/etc/passwd", filepath.Join(dst, "l"))
	if _, err := extractTo(t, makeTar(t, fileEnt("f", "new", 0o644)), dst, "", Options{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "f")); string(b) != "new" {
		t.Errorf("f holds %q", b)
	}
	// A symlink is replaced, not written through.
	if _, err := extractTo(t, makeTar(t, fileEnt("x", "new", 0o644)), dst, "l", Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "l")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("l: %v %v", fi, err)
	}
	if got := entries(t, dst); !slices.Equal(got, []string{"f", "l"}) {
		t.Errorf("parent holds %q", got)
	}
}

func TestExtractMismatch(t *testing.T) {
	dst := t.TempDir()
	writeFile(t, filepath.Join(dst, "file"), "keep", 0o644)
	os.Mkdir(filepath.Join(dst, "dir"), 0o755)
	writeFile(t, filepath.Join(dst, "dir", "x"), "keep", 0o644)
	tree := makeTar(t, dirEnt("t/", 0o755), fileEnt("t/x", "new", 0o644))
	file := makeTar(t, fileEnt("t", "new", 0o644))
	if _, err := extractTo(t, tree, dst, "file", Options{}); err == nil || !strings.Contains(err.Error(), `"file"`) {
		t.Errorf("directory over a file: %v", err)
	}
	if _, err := extractTo(t, file, dst, "dir", Options{}); err == nil || !strings.Contains(err.Error(), `"dir"`) || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("file over a directory: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "file")); string(b) != "keep" {
		t.Errorf("file holds %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "dir", "x")); string(b) != "keep" {
		t.Errorf("dir/x holds %q", b)
	}
	if got := listTemps(t, dst); got != nil {
		t.Errorf("temporaries left: %q", got)
	}
}

func TestExtractMerge(t *testing.T) {
	dst := t.TempDir()
	top := filepath.Join(dst, "top")
	os.Mkdir(top, 0o711)
	os.Chmod(top, 0o711)
	writeFile(t, filepath.Join(top, "unrelated"), "keep", 0o600)
	writeFile(t, filepath.Join(top, "same"), "old", 0o600)
	os.Mkdir(filepath.Join(top, "sub"), 0o700)
	writeFile(t, filepath.Join(top, "sub", "old"), "keep", 0o600)
	data := makeTar(t,
		dirEnt("top/", 0o755),
		fileEnt("top/same", "new", 0o644),
		dirEnt("top/sub/", 0o755),
		fileEnt("top/sub/new", "new", 0o644),
		dirEnt("top/fresh/", 0o750),
		fileEnt("top/fresh/f", "f", 0o644),
		linkEnt("top/link", "same"),
	)
	st, err := extractTo(t, data, dst, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{Name: "top", Files: 3, Dirs: 1, Symlinks: 1, Bytes: 7}) {
		t.Errorf("stats %+v", st)
	}
	got := snapshot(t, top)
	want := map[string]string{"unrelated": "keep", "same": "new", "sub/old": "keep", "sub/new": "new", "fresh/f": "f"}
	for k, v := range want {
		if got[k].Content != v {
			t.Errorf("%s holds %q, want %q", k, got[k].Content, v)
		}
	}
	if got["."].Mode != 0o711 || got["sub"].Mode != 0o700 {
		t.Errorf("existing directories' modes changed: top %v, sub %v", got["."].Mode, got["sub"].Mode)
	}
	if got["fresh"].Mode != 0o750 || got["same"].Mode != 0o644 || got["link"].Link != "same" {
		t.Errorf("new entries: fresh %v, same %v, link %q", got["fresh"].Mode, got["same"].Mode, got["link"].Link)
	}
	if len(got) != 9 {
		t.Errorf("merged tree has %d entries: %v", len(got), got)
	}
	if temps := listTemps(t, dst); temps != nil {
		t.Errorf("temporaries left: %q", temps)
	}

	// Conflicts name the path and leave it alone.
	for _, c := range []struct {
		ents []ent
		want string
	}{
		{[]ent{dirEnt("top/", 0o755), dirEnt("top/same/", 0o755)}, `"same" is a regular file, not a directory`},
		{[]ent{dirEnt("top/", 0o755), fileEnt("top/sub", "x", 0o644)}, `"sub" is a directory`},
		{[]ent{dirEnt("top/", 0o755), linkEnt("top/sub", "x")}, `"sub" is a directory`},
		{[]ent{dirEnt("top/", 0o755), fileEnt("top/same/x", "x", 0o644)}, `"same" is a regular file`},
	} {
		_, err := extractTo(t, makeTar(t, c.ents...), dst, "", Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.ents[1].h.Name, err, c.want)
		}
	}
	if after := snapshot(t, top); len(after) != 9 || after["same"].Content != "new" || after["sub/old"].Content != "keep" {
		t.Errorf("after conflicts: %v", after)
	}
	if temps := listTemps(t, dst); temps != nil {
		t.Errorf("temporaries left: %q", temps)
	}
}

func TestExtractTruncated(t *testing.T) {
	src := t.TempDir()
	buildTree(t, filepath.Join(src, "tree"))
	data, _ := archiveDir(t, src, "tree")
	// Cut in the middle of the random file's content.
	i := bytes.Index(data, []byte("tree/random"))
	if i < 0 {
		t.Fatal("no random file in the archive")
	}
	for _, cut := range []int{i + 512<<10, len(data) - 1024, len(data) - 512, len(data) - 1} {
		dst := t.TempDir()
		_, err := extractTo(t, data[:cut], dst, "", Options{})
		if err == nil {
			t.Errorf("cut at %d of %d: no error", cut, len(data))
		}
		if got := entries(t, dst); len(got) != 0 {
			t.Errorf("cut at %d: parent holds %q", cut, got)
		}
	}
	writeFile(t, filepath.Join(src, "f"), strings.Repeat("x", 100<<10), 0o644)
	data, _ = archiveDir(t, src, "f")
	dst := t.TempDir()
	writeFile(t, filepath.Join(dst, "f"), "old", 0o644)
	for _, cut := range []int{50 << 10, len(data) - 1024, len(data) - 512} {
		if _, err := extractTo(t, data[:cut], dst, "", Options{}); err == nil {
			t.Errorf("file cut at %d of %d: no error", cut, len(data))
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "f")); string(b) != "old" {
		t.Errorf("truncated file replaced the old one: %d bytes", len(b))
	}
	if got := entries(t, dst); !slices.Equal(got, []string{"f"}) {
		t.Errorf("parent holds %q", got)
	}
}

func TestExtractZerosMakeHoles(t *testing.T) {
	const size = 64 << 20
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Size: size + 10, Mode: 0o644})
	tw.Write([]byte("head"))
	tw.Write(make([]byte, size))
	tw.Write([]byte("tail00"))
	tw.Close()
	dst := t.TempDir()
	if _, err := extractTo(t, buf.Bytes(), dst, "", Options{}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "zeros"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size+10 || st.Blocks*512 >= 1<<20 {
		t.Errorf("size %d (want %d), %d bytes of blocks (want under 1 MiB)", st.Size, size+10, st.Blocks*512)
	}
	b, err := os.ReadFile(filepath.Join(dst, "zeros"))
	if err != nil || string(b[:4]) != "head" || string(b[len(b)-6:]) != "tail00" || bytes.ContainsFunc(b[4:len(b)-6], func(r rune) bool { return r != 0 }) {
		t.Errorf("content wrong: %v", err)
	}
}

func TestExtractUmaskAndSpecial(t *testing.T) {
	data := makeTar(t,
		dirEnt("top/", 0o1777),
		fileEnt("top/suid", "x", 0o4755),
		fileEnt("top/sgid", "x", 0o2775),
		fileEnt("top/open", "x", 0o777),
		dirEnt("top/d/", 0o777),
	)
	for _, c := range []struct {
		opts Options
		want map[string]uint32
	}{
		{Options{}, map[string]uint32{".": 0o777, "suid": 0o755, "sgid": 0o775, "open": 0o777, "d": 0o777}},
		{Options{KeepSpecial: true}, map[string]uint32{".": 0o1777, "suid": 0o4755, "sgid": 0o2775, "open": 0o777, "d": 0o777}},
		{Options{Umask: 0o022}, map[string]uint32{".": 0o755, "suid": 0o755, "sgid": 0o755, "open": 0o755, "d": 0o755}},
		{Options{KeepSpecial: true, Umask: 0o027}, map[string]uint32{".": 0o1750, "suid": 0o4750, "sgid": 0o2750, "open": 0o750, "d": 0o750}},
	} {
		dst := t.TempDir()
		if _, err := extractTo(t, data, dst, "", c.opts); err != nil {
			t.Fatal(err)
		}
		for name, want := range c.want {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(dst, "top", name), &st); err != nil {
				t.Fatal(err)
			}
			if st.Mode&0o7777 != want {
				t.Errorf("%+v: %s has mode %#o, want %#o", c.opts, name, st.Mode&0o7777, want)
			}
		}
	}
}

func TestDeepTree(t *testing.T) {
	const depth = 1500
	src, dst := t.TempDir(), t.TempDir()
	p := filepath.Join(src, "deep")
	for i := 0; i < depth; i++ {
		p = filepath.Join(p, "d")
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(p, "bottom"), "bottom", 0o644)
	setTimes(t, filepath.Join(src, "deep"))
	// With few descriptors allowed, one per level would run out.
	restore := lowerFDLimit(t)
	data, st := archiveDir(t, src, "deep")
	if st.Dirs != depth+1 || st.Files != 1 {
		t.Errorf("stats %+v", st)
	}
	if _, err := extractTo(t, data, dst, "", Options{}); err != nil {
		t.Fatal(err)
	}
	// A failing stream: the deep temporary tree is removed.
	dst2 := t.TempDir()
	if _, err := extractTo(t, data[:len(data)-2048], dst2, "", Options{}); err == nil {
		t.Error("truncated deep archive: no error")
	}
	if got := entries(t, dst2); len(got) != 0 {
		t.Errorf("truncated deep archive left %q", got)
	}
	restore()
	compareTrees(t, filepath.Join(src, "deep"), filepath.Join(dst, "deep"))
}

func TestExtractBadName(t *testing.T) {
	dst := t.TempDir()
	data := makeTar(t, fileEnt("f", "x", 0o644))
	for _, name := range []string{".", "..", "a/b", "a\x00"} {
		if _, err := extractTo(t, data, dst, name, Options{}); err == nil {
			t.Errorf("Extract to %q: no error", name)
		}
	}
	if _, err := extractTo(t, makeTar(t), dst, "", Options{}); err == nil || !strings.Contains(err.Error(), "no entry") {
		t.Errorf("empty archive: %v", err)
	}
	if got := entries(t, dst); len(got) != 0 {
		t.Errorf("parent holds %q", got)
	}
}

func TestDeepImplicitChain(t *testing.T) {
	// One entry 5,000 directories down, twice as deep as PATH_MAX allows
	// a path: Extract makes the directories on the way and sets their
	// modes in time linear in the depth, with few descriptors.
	const depth = 5000
	name := "top/" + strings.Repeat("d/", depth) + "f"
	data := makeTar(t, dirEnt("top/", 0o755), fileEnt(name, "bottom", 0o644))
	restore := lowerFDLimit(t)
	defer restore()
	dst := t.TempDir()
	start := time.Now()
	st, err := extractTo(t, data, dst, "", Options{Umask: 0o027})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("extracted %d directories in %v", depth, time.Since(start))
	if st.Dirs != depth+1 || st.Files != 1 {
		t.Errorf("stats %+v", st)
	}
	// Walk down with descriptors, checking the implicit directories' mode.
	fd := openDirFD(t, dst)
	cur, err := unix.Openat(fd, "top", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < depth; i++ {
		var s unix.Stat_t
		if err := unix.Fstatat(cur, "d", &s, unix.AT_SYMLINK_NOFOLLOW); err != nil || s.Mode&0o7777 != 0o750 {
			t.Fatalf("level %d: mode %#o, %v", i, s.Mode&0o7777, err)
		}
		next, err := unix.Openat(cur, "d", unix.O_PATH|unix.O_DIRECTORY, 0)
		unix.Close(cur)
		if err != nil {
			t.Fatal(err)
		}
		cur = next
	}
	var s unix.Stat_t
	err = unix.Fstatat(cur, "f", &s, 0)
	unix.Close(cur)
	if err != nil || s.Size != 6 {
		t.Errorf("bottom file: %v, size %d", err, s.Size)
	}
	if err := removeAll(fd, "top"); err != nil {
		t.Fatal(err)
	}
	// Cut short, the deep temporary tree is removed.
	if _, err := extractTo(t, data[:len(data)-1024], dst, "", Options{}); err == nil {
		t.Error("cut archive: no error")
	}
	if got := entries(t, dst); len(got) != 0 {
		t.Errorf("parent holds %q", got)
	}
}

func TestArchiveMovedWhileRead(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "top", "a", "b"), 0o755)
	writeFile(t, filepath.Join(src, "top", "a", "b", "big"), strings.Repeat("x", 1<<20), 0o644)
	writeFile(t, filepath.Join(src, "top", "z"), "z", 0o644)
	fd := openDirFD(t, src)
	// While big is read, a leaves the tree: the climb back from it
	// would come out beside top, not in it.
	w := &hookWriter{w: io.Discard, hook: func() {
		if err := os.Rename(filepath.Join(src, "top", "a"), filepath.Join(src, "moved")); err != nil {
			t.Error(err)
		}
	}}
	_, err := Archive(context.Background(), w, fd, "top")
	if err == nil || !strings.Contains(err.Error(), "moved while it was read") {
		t.Errorf("Archive with a directory moved out: %v", err)
	}
}
