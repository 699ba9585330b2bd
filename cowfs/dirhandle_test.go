package cowfs

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// rawNames reads a directory with getdents, as ls -a does, and returns
// each name with its d_ino; "." and ".." are kept.
func rawNames(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	got := map[string]uint64{}
	buf := make([]byte, 4096)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatalf("getdents %s: %v", dir, err)
		}
		if n == 0 {
			return got
		}
		for b := buf[:n]; len(b) > 0; {
			reclen := int(uint16(b[16]) | uint16(b[17])<<8)
			name := string(b[19:reclen])
			name = name[:strings.IndexByte(name, 0)]
			got[name] = uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
				uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
			b = b[reclen:]
		}
	}
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// A directory lists "." and ".." first, as on a disk file system (ls -a,
// and tools reading getdents themselves, expect them), with the
// directory's and its parent's inode numbers; the root's ".." is itself.
// Nothing else changes: the same names as a host directory, before and
// after a rewind.
func TestDirListsDots(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	tree := map[string]string{"a/b/f": "x", "a/g": "y", "h": "z"}
	m, _ := mountNew(t, f, "main", tree)
	native := t.TempDir()
	writeTree(t, native, tree)
	if err := os.Mkdir(filepath.Join(m.Dir(), "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(native, "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{".", "a", "a/b", "new"} {
		dir := filepath.Join(m.Dir(), d)
		got := rawNames(t, dir)
		want := rawNames(t, filepath.Join(native, d))
		if names(got) != names(want) {
			t.Errorf("%s lists %s, a host directory %s", d, names(got), names(want))
		}
		if got["."] != ino(t, dir) {
			t.Errorf("%s: . has inode %d, the directory %d", d, got["."], ino(t, dir))
		}
		parent := filepath.Dir(dir)
		if d == "." {
			parent = dir
		}
		if got[".."] != ino(t, parent) {
			t.Errorf("%s: .. has inode %d, its parent %d", d, got[".."], ino(t, parent))
		}
	}
	// A rewind (seekdir 0) lists the dots again, once.
	fd, err := os.Open(filepath.Join(m.Dir(), "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	first, _ := fd.Readdirnames(-1)
	if _, err := fd.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	again, _ := fd.Readdirnames(-1)
	if strings.Join(first, ",") != strings.Join(again, ",") || len(first) != 2 {
		t.Errorf("a lists %v, then after a rewind %v; want [b g] both times", first, again)
	}
}

func names(m map[string]uint64) string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}
