package cowfs

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// TestImportNeverFollowsSwappedSymlink swaps an entry for a symlink to a
// secret outside the tree at the moment between its first look and the
// reading of its contents: the import fails, and the secret's bytes never
// reach the store.
func TestImportNeverFollowsSwappedSymlink(t *testing.T) {
	secretDir := t.TempDir()
	secret := []byte("TOP SECRET: the host's shadow file\n")
	if err := os.WriteFile(filepath.Join(secretDir, "shadow"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	// The control: importing the secret's bytes does store that chunk.
	ctl := openTestFS(t)
	if _, err := ctl.Import(context.Background(), secretDir, ""); err != nil {
		t.Fatal(err)
	}
	if !ctl.Store().Has(chunkstore.Sum(secret)) {
		t.Fatal("an imported file's chunk is not found by its content id: the check below proves nothing")
	}
	for _, c := range []struct{ victim, target string }{
		{"f", filepath.Join(secretDir, "shadow")}, // a file becomes a symlink to the secret
		{"d", secretDir}, // a directory becomes a symlink to the secret's directory
	} {
		t.Run(c.victim, func(t *testing.T) {
			f := openTestFS(t)
			src := t.TempDir()
			writeTree(t, src, map[string]string{"f": "harmless", "d/g": "harmless too"})
			victim := filepath.Join(src, c.victim)
			swapped := false
			importHook = func(path string) {
				if path != victim || swapped {
					return
				}
				swapped = true
				if err := os.RemoveAll(victim); err != nil {
					t.Error(err)
				}
				if err := os.Symlink(c.target, victim); err != nil {
					t.Error(err)
				}
			}
			defer func() { importHook = nil }()
			_, err := f.Import(context.Background(), src, "")
			if !swapped {
				t.Fatal("the hook never ran for", victim)
			}
			if err == nil {
				t.Error("import of a tree changed under it succeeded")
			} else {
				t.Log(err)
			}
			if f.Store().Has(chunkstore.Sum(secret)) {
				t.Error("the secret's bytes were stored")
			}
		})
	}
}

// TestImportHardLinkXattrs checks that every name of a hard-linked file
// carries the file's xattrs, though its content is read once.
func TestImportHardLinkXattrs(t *testing.T) {
	f := openTestFS(t)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "linked"})
	if err := os.Link(filepath.Join(src, "a"), filepath.Join(src, "b")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(src, "a"), "user.k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	snap, err := f.Import(context.Background(), src, "")
	if err != nil {
		t.Fatal(err)
	}
	top, err := f.rootEntry(snap)
	if err != nil {
		t.Fatal(err)
	}
	es, err := getDir(f.store, top.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if len(e.Xattrs) != 1 || e.Xattrs[0].Name != "user.k" || string(e.Xattrs[0].Value) != "v" || e.Nlink != 2 {
			t.Errorf("%s: xattrs %v, nlink %d; want user.k=v and 2 links", e.Name, e.Xattrs, e.Nlink)
		}
	}
}

// TestImportSparseFile: a sparse file is imported by its data regions,
// its holes left unread: a file of 1 TiB with a few bytes of data (what a
// sandbox makes with truncate, then promotes) imports with its content
// intact, in far less than the half hour that reading a terabyte of
// zeros takes here.
func TestImportSparseFile(t *testing.T) {
	f := openTestFS(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "sparse")
	fh, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 40
	marks := map[int64]string{0: "start", 512 << 30: "middle", size - 3: "end"}
	for off, s := range marks {
		if _, err := fh.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
	}
	fh.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	snap, err := f.Import(ctx, dir, "")
	if err != nil {
		t.Fatalf("import of a 1 TiB sparse file: %v", err)
	}
	top, err := f.rootEntry(snap)
	if err != nil {
		t.Fatal(err)
	}
	es, err := getDir(f.store, top.ID)
	if err != nil || len(es) != 1 {
		t.Fatalf("imported %d entries: %v", len(es), err)
	}
	if es[0].Size != size {
		t.Fatalf("imported size %d, want %d", es[0].Size, size)
	}
	r, err := f.contentReader(&es[0])
	if err != nil {
		t.Fatal(err)
	}
	rs, ok := r.(io.ReadSeeker)
	if !ok {
		t.Fatalf("content reader %T cannot seek", r)
	}
	for off, s := range marks {
		buf := make([]byte, len(s))
		if _, err := rs.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(rs, buf); err != nil || string(buf) != s {
			t.Errorf("at %d: %q (%v), want %q", off, buf, err, s)
		}
	}
}
