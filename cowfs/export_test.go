package cowfs

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// importTree imports files (see writeTree) as a snapshot.
func importTree(t *testing.T, f *FS, files map[string]string) SnapshotID {
	t.Helper()
	dir := t.TempDir()
	writeTree(t, dir, files)
	id, err := f.Import(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestDiffKinds(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	a := importTree(t, f, map[string]string{
		"same":        "same\n",
		"edit":        "one\ntwo\n",
		"gone":        "bye\n",
		"gonedir/x":   "x\n",
		"becomesdir":  "file\n",
		"link":        "->target1",
		"odd\nname":   "newline in name\n",
		"sub/deep/k":  "k\n",
		"sub/deep/z":  "z\n",
		"\xff\x01bin": "odd bytes\n",
	})
	b := importTree(t, f, map[string]string{
		"same":          "same\n",
		"edit":          "one\n2\n",
		"new":           "hi\n",
		"becomesdir/in": "inside\n",
		"link":          "->target2",
		"odd\nname":     "changed\n",
		"sub/deep/k":    "k\n",
		"sub/deep/z":    "zz\n",
		"\xff\x01bin":   "odd bytes\n",
		"newdir/a/b":    "b\n",
	})
	changes, err := f.Diff(ctx, a, b)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.Kind.String()+" "+c.Path)
	}
	want := []string{
		"type-changed becomesdir", "added becomesdir/in",
		"modified edit",
		"deleted gone",
		"deleted gonedir", "deleted gonedir/x",
		"modified link",
		"added new",
		"added newdir", "added newdir/a", "added newdir/a/b",
		"modified odd\nname",
		"modified sub/deep/z",
	}
	if !slices.Equal(got, want) {
		t.Errorf("diff:\n got %q\nwant %q", got, want)
	}
	// Identical snapshots: nothing, and no directory read (same root id).
	if ch, err := f.Diff(ctx, a, a); err != nil || len(ch) != 0 {
		t.Errorf("diff of a snapshot with itself = %v, %v", ch, err)
	}
}

func TestDiffModeChange(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"x": "x\n"})
	a, err := f.Import(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "x"), 0o755)
	b, err := f.Import(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := f.Diff(ctx, a, b)
	if err != nil || len(ch) != 1 || ch[0].Kind != ModeChanged || ch[0].Path != "x" {
		t.Fatalf("diff = %+v, %v; want x mode-changed", ch, err)
	}
	var buf bytes.Buffer
	if err := f.WritePatch(ctx, &buf, a, b); err != nil {
		t.Fatal(err)
	}
	if want := "diff --git a/x b/x\nold mode 100644\nnew mode 100755\n"; buf.String() != want {
		t.Errorf("patch = %q, want %q", buf.String(), want)
	}
}

func TestPatchAppliesWithGit(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed")
	}
	f := openTestFS(t)
	ctx := context.Background()
	long := strings.Repeat("line\n", 50)
	afiles := map[string]string{
		"keep":      "keep\n",
		"edit":      "a\nb\nc\n" + long + "d\ne\n",
		"gone":      "bye\n",
		"odd\nname": "x\n",
		"tab\tname": "t\n",
		"nonl":      "no newline",
		"dir/inner": "inner\n",
		"link":      "->keep",
	}
	bfiles := map[string]string{
		"keep":      "keep\n",
		"edit":      "a\nB\nc\n" + long + "d\nE\nf\n",
		"odd\nname": "y\n",
		"tab\tname": "t\n",
		"nonl":      "no newline either",
		"dir/inner": "inner\n",
		"dir/added": "added\n",
		"link":      "->edit",
	}
	a, b := importTree(t, f, afiles), importTree(t, f, bfiles)
	var patch bytes.Buffer
	if err := f.WritePatch(ctx, &patch, a, b); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	writeTree(t, work, afiles)
	cmd := exec.Command(git, "apply", "-p1", "-")
	cmd.Dir = work
	cmd.Stdin = bytes.NewReader(patch.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git apply: %v\n%s\npatch:\n%s", err, out, patch.String())
	}
	want := t.TempDir()
	writeTree(t, want, bfiles)
	for name, content := range bfiles {
		p := filepath.Join(work, name)
		if strings.HasPrefix(content, "->") {
			tgt, err := os.Readlink(p)
			if err != nil || tgt != content[2:] {
				t.Errorf("%q: link %q, %v; want %q", name, tgt, err, content[2:])
			}
			continue
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Errorf("%q after git apply = %q, %v; want %q", name, got, err, content)
		}
	}
	if _, err := os.Stat(filepath.Join(work, "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gone still there after git apply (%v)", err)
	}
}

func TestPatchBinary(t *testing.T) {
	f := openTestFS(t)
	a := importTree(t, f, map[string]string{"bin": "a\x00b"})
	b := importTree(t, f, map[string]string{"bin": "a\x00c"})
	var buf bytes.Buffer
	if err := f.WritePatch(context.Background(), &buf, a, b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "Binary files a/bin and b/bin differ\n") {
		t.Errorf("patch = %q, want a binary notice", buf.String())
	}
}

func TestWriteTar(t *testing.T) {
	f := openTestFS(t)
	a := importTree(t, f, map[string]string{"keep": "k", "gone": "g", "d/gone2": "g2", "edit": "1"})
	big := strings.Repeat("0123456789", 100000)
	b := importTree(t, f, map[string]string{"keep": "k", "edit": "2", "d/new\nline": big, "sym": "->keep"})
	var buf bytes.Buffer
	deleted, err := f.WriteTar(context.Background(), &buf, a, b)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"d/gone2", "gone"}; !slices.Equal(deleted, want) {
		t.Errorf("deleted = %q, want %q", deleted, want)
	}
	tr := tar.NewReader(&buf)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		switch h.Typeflag {
		case tar.TypeSymlink:
			got[h.Name] = "->" + h.Linkname
		default:
			got[h.Name] = string(body)
		}
	}
	want := map[string]string{"d/.wh.gone2": "", ".wh.gone": "", "edit": "2", "d/new\nline": big, "sym": "->keep"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("tar entry %q = %.40q, want %.40q", k, got[k], v)
		}
	}
	if _, ok := got["keep"]; ok {
		t.Error("tar holds unchanged file keep")
	}
}

func TestDeleteSnapshot(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	a := importTree(t, f, map[string]string{"x": "x"})
	if err := f.NameSnapshot(ctx, a, "named"); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteSnapshot(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Resolve(ctx, "named"); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("resolve deleted snapshot name: %v", err)
	}
	if err := f.DeleteSnapshot(ctx, a); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("second delete: %v", err)
	}
}

func TestImportHardLinks(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a/f": "content", "s": "->target", "b/": ""})
	for _, l := range [][2]string{{"a/f", "b/g"}, {"a/f", "h"}, {"s", "b/s2"}} {
		if err := os.Link(filepath.Join(dir, l[0]), filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	id, err := f.Import(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	empty := importTree(t, f, map[string]string{})
	ch, err := f.Diff(ctx, empty, id)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*Entry{}
	for _, c := range ch {
		got[c.Path] = c.New
	}
	f1, g, h := got["a/f"], got["b/g"], got["h"]
	if f1 == nil || g == nil || h == nil || f1.LinkID == 0 || f1.LinkID != g.LinkID || g.LinkID != h.LinkID || f1.Nlink != 3 || g.ID != f1.ID || g.Size != 7 {
		t.Errorf("file links: %+v %+v %+v", f1, g, h)
	}
	s, s2 := got["s"], got["b/s2"]
	if s == nil || s2 == nil || s.LinkID == 0 || s.LinkID != s2.LinkID || s.Nlink != 2 || s2.Target != "target" || s.LinkID == f1.LinkID {
		t.Errorf("symlink links: %+v %+v", s, s2)
	}
}
