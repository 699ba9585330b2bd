package cowfs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A directory's link count (2 plus its subdirectories) follows mkdir,
// rmdir, renames within and across directories, a directory renamed over
// an empty one, rename exchange of a directory with a file and with a
// directory, and survives a remount; each step is mirrored on a host
// directory and the counts compared.
func TestDirLinkCount(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"a/x/": "", "a/y/": "", "a/f": "f", "b/": ""})
	native := t.TempDir()
	writeTree(t, native, map[string]string{"a/x/": "", "a/y/": "", "a/f": "f", "b/": ""})
	dirs := []string{".", "a", "b", "a/x", "a/y", "c"}
	compare := func(when, root string) {
		t.Helper()
		for _, d := range dirs {
			var want, got syscall.Stat_t
			errW := syscall.Lstat(filepath.Join(native, d), &want)
			errG := syscall.Lstat(filepath.Join(root, d), &got)
			if (errW == nil) != (errG == nil) {
				t.Fatalf("%s: %s: host says %v, branch says %v", when, d, errW, errG)
			}
			if errW == nil && want.Nlink != got.Nlink {
				t.Errorf("%s: %s has link count %d, want %d", when, d, got.Nlink, want.Nlink)
			}
		}
	}
	steps := []struct {
		name string
		fn   func(root string) error
	}{
		{"mkdir a/z", func(r string) error { return os.Mkdir(filepath.Join(r, "a/z"), 0o755) }},
		{"mkdir c", func(r string) error { return os.Mkdir(filepath.Join(r, "c"), 0o755) }},
		{"rmdir a/z", func(r string) error { return syscall.Rmdir(filepath.Join(r, "a/z")) }},
		{"rename a/x b/x", func(r string) error { return os.Rename(filepath.Join(r, "a/x"), filepath.Join(r, "b/x")) }},
		{"rename b/x b/x2", func(r string) error { return os.Rename(filepath.Join(r, "b/x"), filepath.Join(r, "b/x2")) }},
		{"rename a/y over c", func(r string) error { return syscall.Rename(filepath.Join(r, "a/y"), filepath.Join(r, "c")) }},
		{"mkdir a/y", func(r string) error { return os.Mkdir(filepath.Join(r, "a/y"), 0o755) }},
		{"exchange a/f b/x2", func(r string) error {
			return unix.Renameat2(unix.AT_FDCWD, filepath.Join(r, "a/f"), unix.AT_FDCWD, filepath.Join(r, "b/x2"), unix.RENAME_EXCHANGE)
		}},
		{"exchange a/y b", func(r string) error {
			return unix.Renameat2(unix.AT_FDCWD, filepath.Join(r, "a/y"), unix.AT_FDCWD, filepath.Join(r, "b"), unix.RENAME_EXCHANGE)
		}},
		{"mkdir a/y/deep", func(r string) error { return os.Mkdir(filepath.Join(r, "a/y/deep"), 0o755) }},
	}
	dirs = append(dirs, "b/x2", "a/f", "a/y/deep", "a/y/x2")
	compare("start", m.Dir())
	for _, s := range steps {
		if err := s.fn(native); err != nil {
			t.Fatalf("host: %s: %v", s.name, err)
		}
		if err := s.fn(m.Dir()); err != nil {
			t.Fatalf("branch: %s: %v", s.name, err)
		}
		compare("after "+s.name, m.Dir())
	}
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	m2, err := f.Mount(ctx, "main", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Unmount()
	compare("after a remount", m2.Dir())
}

// A stat of a directory not yet listed gives its link count from its
// cached directory object alone: the directory stays unloaded (no inode
// is built for each of its children). One too big for the cache is
// loaded instead.
func TestDirLinkCountUnloaded(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"d/s1/": "", "d/s2/": "", "d/s3/x": "x", "d/f": "f"})
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(m.Dir(), "d"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Nlink != 5 {
		t.Errorf("d has link count %d, want 5 (2 and its 3 subdirectories)", st.Nlink)
	}
	b := m.b
	b.mu.Lock()
	d := b.root.children["d"]
	loaded := d != nil && d.loaded
	b.mu.Unlock()
	if d == nil || loaded {
		t.Errorf("d after a stat: %v, want an unloaded directory", d)
	}
	names, err := os.ReadDir(filepath.Join(m.Dir(), "d"))
	if err != nil || len(names) != 4 {
		t.Fatalf("d lists %d entries (%v), want 4", len(names), err)
	}
	if err := syscall.Lstat(filepath.Join(m.Dir(), "d"), &st); err != nil || st.Nlink != 5 {
		t.Errorf("d once listed: link count %d (%v), want 5", st.Nlink, err)
	}

	// A directory too big for the directory cache is loaded by its first
	// stat, and not decoded again by later ones.
	f2 := openTestFS(t)
	f2.dirs.max = 64
	m2, _ := mountNew(t, f2, "main", map[string]string{"d/s1/": "", "d/f": "f"})
	for i := 0; i < 2; i++ {
		if err := syscall.Lstat(filepath.Join(m2.Dir(), "d"), &st); err != nil || st.Nlink != 3 {
			t.Fatalf("uncached d: link count %d (%v), want 3", st.Nlink, err)
		}
	}
	b2 := m2.b
	b2.mu.Lock()
	d2 := b2.root.children["d"]
	loaded = d2 != nil && d2.loaded
	b2.mu.Unlock()
	if !loaded {
		t.Error("a directory too big for the cache stayed unloaded after a stat: each stat would decode it again")
	}
}
