package cowfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// needFUSE skips the test when the machine cannot mount FUSE filesystems.
func needFUSE(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("/dev/fuse is missing")
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root (euid is not 0)")
	}
}

func openTestFS(t testing.TB) *FS {
	t.Helper()
	return openTestFSWith(t, nil)
}

func openTestFSWith(t testing.TB, opts *Options) *FS {
	t.Helper()
	f, err := Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// writeTree creates files under dir: a map from relative path to content;
// a path ending in "/" is a directory, content "->x" a symlink to x.
func writeTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if p[len(p)-1] == '/' {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if len(c) > 2 && c[:2] == "->" {
			if err := os.Symlink(c[2:], full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// mountNew imports files as a snapshot, forks branch name from it and
// mounts the branch; the mount is undone at cleanup.
func mountNew(t testing.TB, f *FS, name string, files map[string]string) (*Mount, SnapshotID) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, files)
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Branch(ctx, snap, name); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	m, err := f.Mount(ctx, name, mnt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount() })
	return m, snap
}
