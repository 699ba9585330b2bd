package treecopy

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openDirFD opens the directory p for the duration of the test.
func openDirFD(t testing.TB, p string) int {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// fdCount returns how many descriptors the process has open.
func fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// archiveDir archives name in the directory parent, checking that no
// descriptor leaks.
func archiveDir(t testing.TB, parent, name string) ([]byte, Stats) {
	t.Helper()
	fd := openDirFD(t, parent)
	before := fdCount(t)
	var buf bytes.Buffer
	st, err := Archive(context.Background(), &buf, fd, name)
	if err != nil {
		t.Fatalf("Archive(%q): %v", name, err)
	}
	if after := fdCount(t); after != before {
		t.Fatalf("Archive leaked descriptors: %d before, %d after", before, after)
	}
	return buf.Bytes(), st
}

// extractTo extracts data into the directory parent as name, checking
// that no descriptor leaks.
func extractTo(t testing.TB, data []byte, parent, name string, opts Options) (Stats, error) {
	t.Helper()
	fd := openDirFD(t, parent)
	before := fdCount(t)
	st, err := Extract(context.Background(), bytes.NewReader(data), fd, name, opts)
	if after := fdCount(t); after != before {
		t.Fatalf("Extract leaked descriptors: %d before, %d after", before, after)
	}
	return st, err
}

// node is what a test compares of one file.
type node struct {
	Type    fs.FileMode
	Mode    fs.FileMode // permission and special bits
	Size    int64
	Content string
	Link    string
	MTime   time.Time
}

// snapshot records the tree at root (root itself as "."), not following
// symlinks.
func snapshot(t testing.TB, root string) map[string]node {
	t.Helper()
	m := map[string]node{}
	var walk func(rel string)
	walk = func(rel string) {
		p := filepath.Join(root, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		n := node{
			Mode:  fs.FileMode(st.Mode & 0o777),
			MTime: time.Unix(st.Mtim.Unix()),
		}
		if st.Mode&unix.S_ISUID != 0 {
			n.Mode |= fs.ModeSetuid
		}
		if st.Mode&unix.S_ISGID != 0 {
			n.Mode |= fs.ModeSetgid
		}
		if st.Mode&unix.S_ISVTX != 0 {
			n.Mode |= fs.ModeSticky
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			n.Type = fs.ModeDir
			ents, err := os.ReadDir(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				walk(filepath.Join(rel, e.Name()))
			}
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			n.Size, n.Content = st.Size, string(b)
		case unix.S_IFLNK:
			n.Type = fs.ModeSymlink
			l, err := os.Readlink(p)
			if err != nil {
				t.Fatal(err)
			}
			n.Link = l
		default:
			n.Type = fs.ModeIrregular
		}
		m[rel] = n
	}
	walk(".")
	return m
}

// compareTrees fails t unless the trees at a and b match: types, modes,
// contents, symlink targets and modification times.
func compareTrees(t testing.TB, a, b string) {
	t.Helper()
	sa, sb := snapshot(t, a), snapshot(t, b)
	var keys []string
	for k := range sa {
		keys = append(keys, k)
	}
	for k := range sb {
		if _, ok := sa[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	bad := 0
	for _, k := range keys {
		na, oka := sa[k]
		nb, okb := sb[k]
		switch {
		case !oka:
			t.Errorf("%q: only in the copy", k)
		case !okb:
			t.Errorf("%q: missing from the copy", k)
		case na.Type != nb.Type || na.Mode != nb.Mode || na.Size != nb.Size || na.Link != nb.Link || !na.MTime.Equal(nb.MTime):
			t.Errorf("%q: source %v %v size %d link %q mtime %v; copy %v %v size %d link %q mtime %v",
				k, na.Type, na.Mode, na.Size, na.Link, na.MTime, nb.Type, nb.Mode, nb.Size, nb.Link, nb.MTime)
		case na.Content != nb.Content:
			t.Errorf("%q: content differs", k)
		default:
			continue
		}
		if bad++; bad > 20 {
			t.Fatal("too many differences")
		}
	}
}

// ent is one entry of a hand-made archive.
type ent struct {
	h    tar.Header
	body string
}

// makeTar writes the entries as a tar stream.
func makeTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.h
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(e.body))
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1_500_000_000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write header %q: %v", h.Name, err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func dirEnt(name string, mode int64) ent {
	return ent{h: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}

func fileEnt(name, body string, mode int64) ent {
	return ent{h: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, body: body}
}

func linkEnt(name, target string) ent {
	return ent{h: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

// writeFile makes a file with exactly the mode given.
func writeFile(t testing.TB, p, body string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// setTimes gives every file under root (root included, symlinks not
// followed) a distinct modification time, children before parents.
func setTimes(t testing.TB, root string) {
	t.Helper()
	i := 0
	var walk func(p string)
	walk = func(p string) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			ents, err := os.ReadDir(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				walk(filepath.Join(p, e.Name()))
			}
		}
		i++
		ts := unix.NsecToTimespec(time.Unix(1_600_000_000+int64(i)*3600, int64(i)*1000+7).UnixNano())
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
	walk(root)
}

// listTemps returns the paths under root whose names start as
// Extract's temporaries do.
func listTemps(t testing.TB, root string) []string {
	t.Helper()
	var found []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if strings.HasPrefix(d.Name(), tempPrefix) {
			found = append(found, p)
		}
		return nil
	})
	return found
}

// entries lists the names in dir.
func entries(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// sandbox is a test layout: base holds parent, where extraction goes,
// and sentinel, which no extraction may touch.
type sandbox struct {
	base, parent, sentinel string
	before                 map[string]node
}

func newSandbox(t testing.TB) *sandbox {
	t.Helper()
	s := newSentinel(t, t.TempDir())
	if err := os.Mkdir(s.parent, 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

// newSentinel makes the sentinel in base, not the parent.
func newSentinel(t testing.TB, base string) *sandbox {
	t.Helper()
	s := &sandbox{base: base, parent: filepath.Join(base, "parent"), sentinel: filepath.Join(base, "sentinel")}
	for _, d := range []string{s.sentinel, filepath.Join(s.sentinel, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(s.sentinel, "keep"), "sentinel", 0o644)
	writeFile(t, filepath.Join(s.sentinel, "sub", "keep"), "sentinel", 0o644)
	s.before = snapshot(t, s.sentinel)
	return s
}

// checkOutside fails t if anything beside parent changed.
func (s *sandbox) checkOutside(t testing.TB) {
	t.Helper()
	if got := entries(t, s.base); !slices.Equal(got, []string{"parent", "sentinel"}) {
		t.Errorf("beside parent: %q, want only parent and sentinel", got)
	}
	if after := snapshot(t, s.sentinel); fmt.Sprint(after) != fmt.Sprint(s.before) {
		t.Errorf("sentinel changed: %v, was %v", after, s.before)
	}
}

// lowerFDLimit lowers the open-file limit to the descriptors open now
// plus maxOpen and a margin, so that keeping one per directory level
// would run out; restore (also run when the test ends) puts it back.
func lowerFDLimit(t *testing.T) (restore func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = uint64(fdCount(t) + maxOpen + 40)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restore = func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &old) }
	t.Cleanup(restore)
	return restore
}
