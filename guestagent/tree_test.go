package guestagent

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tine/internal/treecopy"
)

// archiveOf is the tar stream of host directory dir, as tine cp sends it.
func archiveOf(t *testing.T, dir string) []byte {
	t.Helper()
	parent, err := os.Open(filepath.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	var b bytes.Buffer
	if _, err := treecopy.Archive(context.Background(), &b, int(parent.Fd()), filepath.Base(dir)); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestPutGetTree copies a tree in (as a new path, then into an existing
// directory) and out again.
func TestPutGetTree(t *testing.T) {
	c, root := startAgent(t)
	ctx := ctxT(t)
	src := filepath.Join(t.TempDir(), "src")
	os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "deep", "f"), []byte("deep"), 0o640)
	os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.Chmod(filepath.Join(src, "run.sh"), 0o755|os.ModeSetuid)
	os.Symlink("sub/deep/f", filepath.Join(src, "link"))
	tarball := archiveOf(t, src)

	got, err := c.PutTree(ctx, "/new", false, bytes.NewReader(tarball))
	if err != nil || got != "/new" {
		t.Fatalf("put as a new path: %q %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "new/sub/deep/f")); err != nil || string(b) != "deep" {
		t.Fatalf("the copied file: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(root, "new/run.sh")); err != nil || st.Mode()&os.ModeSetuid == 0 || st.Mode().Perm() != 0o755 {
		t.Errorf("a setuid file copied in keeps its mode: %v %v", st.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(root, "new/link")); err != nil || l != "sub/deep/f" {
		t.Errorf("the symlink: %q %v", l, err)
	}
	// The same path now names a directory: the copy goes inside it.
	if got, err := c.PutTree(ctx, "new/", true, bytes.NewReader(tarball)); err != nil || got != "/new/src" {
		t.Fatalf("put into an existing directory: %q %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(root, "new/src/sub/deep/f")); err != nil {
		t.Fatal(err)
	}
	// tar(1) pads its stream to a 10 KiB record after the end marker; the
	// agent answers only after the host's end, however late the padding.
	padded := io.MultiReader(bytes.NewReader(tarball), &slowReader{d: 200 * time.Millisecond, r: bytes.NewReader(make([]byte, 10240))})
	if got, err := c.PutTree(ctx, "/padded", false, padded); err != nil || got != "/padded" {
		t.Fatalf("put of a padded stream: %q %v", got, err)
	}
	if _, err := c.PutTree(ctx, "/missing", true, bytes.NewReader(tarball)); err == nil || !strings.Contains(err.Error(), "not an existing directory") {
		t.Errorf("into a missing directory: %v", err)
	}
	if _, err := c.PutTree(ctx, "/missing/x", false, bytes.NewReader(tarball)); err == nil {
		t.Error("put under a missing parent succeeded")
	}

	var out bytes.Buffer
	if err := c.GetTree(ctx, "/new/src", &out); err != nil {
		t.Fatal(err)
	}
	back := t.TempDir()
	bd, _ := os.Open(back)
	defer bd.Close()
	st, err := treecopy.Extract(ctx, &out, int(bd.Fd()), "", treecopy.Options{})
	if err != nil || st.Files != 2 || st.Dirs != 3 || st.Symlinks != 1 {
		t.Fatalf("get the tree back: %+v %v", st, err)
	}
	if b, err := os.ReadFile(filepath.Join(back, "src/sub/deep/f")); err != nil || string(b) != "deep" {
		t.Fatalf("the file that came back: %q %v", b, err)
	}
	for _, p := range []string{"/", "/nonexistent"} {
		if err := c.GetTree(ctx, p, new(bytes.Buffer)); err == nil {
			t.Errorf("get %s: no error", p)
		}
	}
}

// TestPutTreeRefusesEscapes: a tree lands inside the agent's root whatever
// its destination's symlinks say, and an archive with an entry that leaves
// its top is refused with nothing left behind.
func TestPutTreeRefusesEscapes(t *testing.T) {
	c, root := startAgent(t)
	ctx := ctxT(t)
	os.Symlink("/", filepath.Join(root, "dirlink"))
	src := filepath.Join(t.TempDir(), "t")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	if got, err := c.PutTree(ctx, "dirlink/escaped", false, bytes.NewReader(archiveOf(t, src))); err != nil || got != "/dirlink/escaped" {
		t.Fatalf("put: %q %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(root, "escaped/f")); err != nil {
		t.Fatalf("the tree did not land in the root: %v", err)
	}

	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "t/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "t/ok", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("y"))
	tw.WriteHeader(&tar.Header{Name: "t/../../x", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	if _, err := c.PutTree(ctx, "/bad", false, &b); err == nil {
		t.Fatal("an archive with a .. entry was taken")
	}
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if e.Name() == "bad" || e.Name() == "x" || strings.HasPrefix(e.Name(), ".tine-cp-") {
			t.Errorf("a refused archive left %s behind", e.Name())
		}
	}
}

// slowReader waits d before its first read.
type slowReader struct {
	d     time.Duration
	r     io.Reader
	slept bool
}

func (s *slowReader) Read(b []byte) (int, error) {
	if !s.slept {
		time.Sleep(s.d)
		s.slept = true
	}
	return s.r.Read(b)
}
