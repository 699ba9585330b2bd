package cowfs

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// importWalking imports dir into f and reports whether the import walked
// the tree (false: the import watch answered).
func importWalking(t *testing.T, f *FS, dir string) (SnapshotID, bool) {
	t.Helper()
	walked := false
	importHook = func(string) { walked = true }
	defer func() { importHook = nil }()
	id, err := f.Import(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	return id, walked
}

// watchesHeld is the number of inotify watches f's import watch holds.
func watchesHeld(f *FS) int {
	f.watch.mu.Lock()
	defer f.watch.mu.Unlock()
	return f.watch.held
}

func TestImportWatchSkipsUnchangedTree(t *testing.T) {
	f := openTestFS(t)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "alpha", "d/b": "beta", "d/e/c": "gamma", "l": "->a"})
	id1, walked := importWalking(t, f, src)
	if !walked {
		t.Fatal("the first import did not walk")
	}
	if got := watchesHeld(f); got != 3 {
		t.Errorf("%d watches held for a tree of 3 directories", got)
	}
	for i := 0; i < 3; i++ {
		id, walked := importWalking(t, f, src)
		if walked || id != id1 {
			t.Fatalf("re-import %d of an unchanged tree: walked %v, id %s (first %s)", i, walked, id, id1)
		}
	}
	// A name given to an unwalked import is kept.
	if _, err := f.Import(context.Background(), src, "named"); err != nil {
		t.Fatal(err)
	}
	if id, err := f.Resolve(context.Background(), "named"); err != nil || id != id1 {
		t.Errorf("named import resolves to %s, %v; want %s", id, err, id1)
	}
	// A snapshot deleted since is not handed out again.
	if err := f.DeleteSnapshot(context.Background(), id1); err != nil {
		t.Fatal(err)
	}
	if id, walked := importWalking(t, f, src); !walked || id != id1 {
		t.Errorf("import after the snapshot was deleted: walked %v, id %s", walked, id)
	}
	if id, walked := importWalking(t, f, src); walked || id != id1 {
		t.Errorf("import after that: walked %v, id %s", walked, id)
	}
}

// TestImportWatchSeesEveryChange makes one kind of change after an
// import whose tree is watched; the next import must walk and give what
// a fresh import gives.
func TestImportWatchSeesEveryChange(t *testing.T) {
	outside := t.TempDir()
	changes := map[string]func(t *testing.T, src string){
		"rewrite in place, mtime put back": func(t *testing.T, src string) {
			p := filepath.Join(src, "d/e/c")
			fi, _ := os.Stat(p)
			mustDo(t, os.WriteFile(p, []byte("GAMMA"), 0o644))
			mustDo(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
		},
		"append": func(t *testing.T, src string) {
			fh, err := os.OpenFile(filepath.Join(src, "a"), os.O_APPEND|os.O_WRONLY, 0)
			mustDo(t, err)
			_, err = fh.WriteString("more")
			mustDo(t, err)
			mustDo(t, fh.Close())
		},
		"truncate": func(t *testing.T, src string) { mustDo(t, os.Truncate(filepath.Join(src, "d/b"), 1)) },
		"fallocate": func(t *testing.T, src string) {
			fh, err := os.OpenFile(filepath.Join(src, "d/b"), os.O_WRONLY, 0)
			mustDo(t, err)
			defer fh.Close()
			mustDo(t, unix.Fallocate(int(fh.Fd()), 0, 0, 1<<16))
		},
		"chmod file":     func(t *testing.T, src string) { mustDo(t, os.Chmod(filepath.Join(src, "d/e/c"), 0o600)) },
		"chmod top":      func(t *testing.T, src string) { mustDo(t, os.Chmod(src, 0o711)) },
		"mtime of a dir": func(t *testing.T, src string) { mustDo(t, os.Chtimes(filepath.Join(src, "d"), aTime, aTime)) },
		"chown":          func(t *testing.T, src string) { mustDo(t, os.Lchown(filepath.Join(src, "l"), 1234, 1234)) },
		"user xattr": func(t *testing.T, src string) {
			mustDo(t, unix.Setxattr(filepath.Join(src, "a"), "user.k", []byte("v"), 0))
		},
		"new file deep":    func(t *testing.T, src string) { writeTree(t, src, map[string]string{"d/e/new": "x"}) },
		"new dir":          func(t *testing.T, src string) { writeTree(t, src, map[string]string{"d/e/f/": ""}) },
		"symlink":          func(t *testing.T, src string) { mustDo(t, os.Symlink("d", filepath.Join(src, "d/e/s"))) },
		"fifo":             func(t *testing.T, src string) { mustDo(t, unix.Mkfifo(filepath.Join(src, "d/p"), 0o644)) },
		"remove file deep": func(t *testing.T, src string) { mustDo(t, os.Remove(filepath.Join(src, "d/e/c"))) },
		"remove dir":       func(t *testing.T, src string) { mustDo(t, os.RemoveAll(filepath.Join(src, "d/e"))) },
		"rename inside": func(t *testing.T, src string) {
			mustDo(t, os.Rename(filepath.Join(src, "d/b"), filepath.Join(src, "d/e/b2")))
		},
		"rename dir inside": func(t *testing.T, src string) {
			mustDo(t, os.Rename(filepath.Join(src, "d/e"), filepath.Join(src, "e")))
		},
		"move out": func(t *testing.T, src string) {
			mustDo(t, os.Rename(filepath.Join(src, "d/e"), filepath.Join(outside, "moved-out")))
		},
		"move in": func(t *testing.T, src string) {
			dir := filepath.Join(outside, "moved-in")
			writeTree(t, dir, map[string]string{"x": "from outside"})
			mustDo(t, os.Rename(dir, filepath.Join(src, "d/e/in")))
		},
		"top replaced": func(t *testing.T, src string) {
			mustDo(t, os.Rename(src, src+".old"))
			writeTree(t, src, map[string]string{"a": "alpha", "d/b": "beta", "d/e/c": "other"})
		},
		"change in a directory written to before": func(t *testing.T, src string) {
			// The file was created, imported, imported again (unwalked)
			// before this change: its directory's watch is the new one.
			mustDo(t, os.WriteFile(filepath.Join(src, "d/e/later"), []byte("later, changed"), 0o644))
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			f := openTestFS(t)
			src := filepath.Join(t.TempDir(), "src")
			writeTree(t, src, map[string]string{"a": "alpha", "d/b": "beta", "d/e/c": "gamma", "l": "->a"})
			if strings.HasPrefix(name, "change in a directory") {
				importWalking(t, f, src)
				writeTree(t, src, map[string]string{"d/e/later": "later"})
			}
			id1, _ := importWalking(t, f, src)
			if _, walked := importWalking(t, f, src); walked {
				t.Fatal("the tree was walked with no change")
			}
			change(t, src)
			id, walked := importWalking(t, f, src)
			if !walked {
				t.Fatal("the change was not seen: the import did not walk")
			}
			if want := fresh(t, src); id != want || id == id1 {
				t.Errorf("import after the change gave %s, a fresh import %s, before %s", id, want, id1)
			}
		})
	}
}

var aTime = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestImportWatchChangeDuringWalk changes a file while the import walks
// its directory (after that directory's watch was added): the import may
// or may not hold the change, but the next one must walk.
func TestImportWatchChangeDuringWalk(t *testing.T) {
	f := openTestFS(t)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a/x": "one", "a/y": "two", "b/z": "three"})
	once := false
	importHook = func(path string) {
		if !once && strings.HasSuffix(path, "a/y") {
			once = true
			os.WriteFile(filepath.Join(src, "a/x"), []byte("ONE"), 0o644)
		}
	}
	_, err := f.Import(context.Background(), src, "")
	importHook = nil
	mustDo(t, err)
	if !once {
		t.Fatal("the hook never ran")
	}
	id, walked := importWalking(t, f, src)
	if !walked || id != fresh(t, src) {
		t.Errorf("import after a change during the walk: walked %v, same as fresh %v", walked, id == fresh(t, src))
	}
}

// TestImportWatchNotTrusted: trees that can change without an event
// reaching the watch are walked every time.
func TestImportWatchNotTrusted(t *testing.T) {
	t.Run("hard link", func(t *testing.T) {
		f := openTestFS(t)
		src := t.TempDir()
		writeTree(t, src, map[string]string{"a": "alpha", "d/b": "beta"})
		mustDo(t, os.Link(filepath.Join(src, "a"), filepath.Join(t.TempDir(), "elsewhere")))
		for i := 0; i < 2; i++ {
			if _, walked := importWalking(t, f, src); !walked {
				t.Fatalf("import %d of a tree with a hard-linked file did not walk", i)
			}
		}
		if got := watchesHeld(f); got != 0 {
			t.Errorf("%d watches held for a tree that is not watched", got)
		}
	})
	t.Run("FUSE", func(t *testing.T) {
		f := openTestFS(t)
		m, _ := mountNew(t, f, "br", map[string]string{"a": "alpha", "d/b": "beta"})
		for i := 0; i < 2; i++ {
			if _, walked := importWalking(t, f, m.Dir()); !walked {
				t.Fatalf("import %d of a tree on a FUSE mount did not walk", i)
			}
		}
	})
	t.Run("over the budget", func(t *testing.T) {
		defer func(n int) { maxImportWatches = n }(maxImportWatches)
		maxImportWatches = 2
		f := openTestFS(t)
		src := t.TempDir()
		writeTree(t, src, map[string]string{"a/x": "", "b/y": "", "c/z": ""})
		for i := 0; i < 2; i++ {
			if _, walked := importWalking(t, f, src); !walked {
				t.Fatalf("import %d of 4 directories with a budget of 2 watches did not walk", i)
			}
		}
		if got := watchesHeld(f); got != 0 {
			t.Errorf("%d watches held after an import over the budget", got)
		}
		small := t.TempDir()
		writeTree(t, small, map[string]string{"a/x": ""})
		importWalking(t, f, small)
		if _, walked := importWalking(t, f, small); walked {
			t.Error("a tree within the budget walked with no change")
		}
	})
}

// TestImportWatchOverflow fills the kernel's event queue under one tree:
// every tree is walked again, another unchanged one included.
func TestImportWatchOverflow(t *testing.T) {
	const sysctl = "/proc/sys/fs/inotify/max_queued_events"
	b, err := os.ReadFile(sysctl)
	mustDo(t, err)
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	mustDo(t, err)
	var f *FS
	if max > 16384 {
		// An instance takes the limit when it is made: lower it while the
		// FS makes its own, so that the queue fills in a moment.
		mustDo(t, os.WriteFile(sysctl, []byte("16384"), 0))
		f = openTestFS(t)
		mustDo(t, os.WriteFile(sysctl, b, 0))
		max = 16384
	} else {
		f = openTestFS(t)
	}
	busy, quiet := t.TempDir(), t.TempDir()
	writeTree(t, busy, map[string]string{"a": "", "b": ""})
	writeTree(t, quiet, map[string]string{"q": "quiet"})
	importWalking(t, f, busy)
	importWalking(t, f, quiet)
	// Alternate two names so that the kernel cannot merge the events.
	for i := 0; i <= max/2+1; i++ {
		mustDo(t, os.Chtimes(filepath.Join(busy, "a"), aTime, aTime))
		mustDo(t, os.Chtimes(filepath.Join(busy, "b"), aTime, aTime))
	}
	if _, walked := importWalking(t, f, quiet); !walked {
		t.Error("after an overflow of the event queue an unchanged tree was not walked")
	}
	if id, walked := importWalking(t, f, busy); !walked || id != fresh(t, busy) {
		t.Error("after an overflow the changed tree was not walked")
	}
	if got := watchesHeld(f); got != 2 {
		t.Errorf("%d watches held after both trees were imported again, want 2", got)
	}
}
