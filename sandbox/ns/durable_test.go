package ns

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// forceFsync makes syncTree take its fsync walk whatever is dirty, for
// the test's length.
func forceFsync(t *testing.T) {
	old := syncDirtyMax
	syncDirtyMax = -1
	t.Cleanup(func() { syncDirtyMax = old })
}

// TestSyncTree: a tree's new bytes are those of its files with one name;
// the fsync walk goes through directories, files, hard links, symlinks, a FIFO (never opened, so never blocking) and a
// socket, follows no symlink (one to a tree deeper than the walk goes
// would fail it), and leaves the tree as it was; a tree too deep for it
// is written out with syncfs instead.
func TestSyncTree(t *testing.T) {
	forceFsync(t)
	if d, ok := dirtyBytes(); !ok || d < 0 {
		t.Fatalf("dirtyBytes: %d, %v", d, ok)
	}
	ctx := context.Background()
	root := t.TempDir()
	tree := filepath.Join(root, "tree")
	deep := filepath.Join(root, "deep", strings.Repeat("d/", maxLayerDepth+2))
	for _, d := range []string{filepath.Join(tree, "a", "b"), deep} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "a", "b", "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		os.Link(filepath.Join(tree, "a", "b", "f"), filepath.Join(tree, "hl")),
		os.Symlink(filepath.Join(root, "deep"), filepath.Join(tree, "out")),
		unix.Mkfifo(filepath.Join(tree, "fifo"), 0o644),
		unix.Mknod(filepath.Join(tree, "sock"), unix.S_IFSOCK|0o644, 0),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "own"), make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := newBytes(ctx, tree); n != 8192 {
		t.Fatalf("newBytes: %d, want 8192 (own; f has a second name)", n)
	}
	if err := fsyncTree(ctx, tree); err != nil {
		t.Fatalf("fsync walk: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(tree, "hl")); err != nil || string(b) != "data" {
		t.Fatalf("after the walk: %q, %v", b, err)
	}
	if err := fsyncTree(ctx, filepath.Join(root, "deep")); !errors.Is(err, errTooDeep) {
		t.Fatalf("fsync walk of a tree deeper than it goes: %v, want errTooDeep", err)
	}
	if err := syncTree(ctx, filepath.Join(root, "deep")); err != nil {
		t.Fatalf("syncTree of a deep tree: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := syncTree(cctx, tree); !errors.Is(err, context.Canceled) {
		t.Fatalf("syncTree with its context cancelled: %v", err)
	}
}

// TestSyncTreeOnAChangingTree: the walk over a tree that is changing
// under it (a sandbox's own layer, synced before a pre-copy while the
// sandbox runs: directories made, filled, removed and swapped for
// symlinks) never fails for it.
func TestSyncTreeOnAChangingTree(t *testing.T) {
	forceFsync(t)
	ctx := context.Background()
	tree := t.TempDir()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d := filepath.Join(tree, "d"+string(rune('a'+i%4)))
			os.MkdirAll(filepath.Join(d, "x", "y"), 0o755)
			os.WriteFile(filepath.Join(d, "x", "f"), []byte("f"), 0o644)
			os.RemoveAll(d)
			os.Symlink("/", d)
			os.Remove(d)
		}
	}()
	for range 200 {
		if err := fsyncTree(ctx, tree); err != nil {
			close(stop)
			<-done
			t.Fatalf("fsync walk of a changing tree: %v", err)
		}
	}
	close(stop)
	<-done
}
