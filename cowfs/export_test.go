package cowfs

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"tine/chunkstore"
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

// tn describes one entry for putTree: e carries type and metadata (Type
// zero means a 0644 file), data the content of a file or refs its chunk
// list, kids the entries of a directory.
type tn struct {
	name string
	e    Entry
	data string
	refs []chunkstore.Ref
	kids []tn
}

// putTree stores a snapshot built straight from entries, for trees no
// import could make (holes of a terabyte, depth 4096, foreign owners).
func putTree(t testing.TB, f *FS, kids []tn) SnapshotID {
	t.Helper()
	id, err := putRoot(f.store, putEntry(t, f, tn{e: Entry{Type: TypeDir, Mode: 0o755}, kids: kids}))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func putEntry(t testing.TB, f *FS, n tn) Entry {
	e := n.e
	e.Name = n.name
	if e.Type == 0 {
		e.Type = TypeFile
	}
	if e.Mode == 0 {
		e.Mode = 0o644
	}
	var err error
	switch e.Type {
	case TypeDir:
		var es []Entry
		for _, k := range n.kids {
			es = append(es, putEntry(t, f, k))
		}
		e.ID, err = putDir(f.store, es)
	case TypeFile:
		refs := n.refs
		if refs == nil && n.data != "" {
			refs, err = f.store.PutStream(context.Background(), strings.NewReader(n.data))
			if err != nil {
				t.Fatal(err)
			}
		}
		e.Size = 0
		for _, r := range refs {
			e.Size += int64(r.Size)
		}
		e.ID, err = putFile(f.store, fileRefs(refs))
	case TypeSymlink:
		e.Size = int64(len(e.Target))
	}
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// allocDuring returns the bytes allocated while fn ran.
func allocDuring(fn func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	fn()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
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
	// DiffEach hands out the same changes in the same order, and stops
	// at the first error its function returns.
	stop := errors.New("stop")
	got = got[:0]
	err = f.DiffEach(ctx, a, b, DiffOptions{GitInternals: true}, func(c Change) error {
		got = append(got, c.Kind.String()+" "+c.Path)
		if len(got) == 4 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || !slices.Equal(got, want[:4]) {
		t.Errorf("DiffEach stopped at the fourth change: %v, %q", err, got)
	}
}

// TestDiffDeep diffs trees 4096 directories deep with the goroutine stack
// capped far below what a recursive walk of that depth needs.
func TestDiffDeep(t *testing.T) {
	f := openTestFS(t)
	const depth = 4096
	chain := func(leaf string) []tn {
		n := tn{name: "f", data: leaf}
		for i := 0; i < depth; i++ {
			n = tn{name: "d", e: Entry{Type: TypeDir, Mode: 0o755}, kids: []tn{n}}
		}
		return []tn{n}
	}
	empty := putTree(t, f, nil)
	a, b := putTree(t, f, chain("one\n")), putTree(t, f, chain("two\n"))
	done := make(chan struct{})
	var added, modified []Change
	var err1, err2 error
	go func() {
		defer close(done)
		old := debug.SetMaxStack(256 << 10)
		defer debug.SetMaxStack(old)
		added, err1 = f.Diff(context.Background(), empty, a)
		modified, err2 = f.Diff(context.Background(), a, b)
	}()
	<-done
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if len(added) != depth+1 || added[depth].Path != strings.Repeat("d/", depth)+"f" {
		t.Errorf("added: %d changes, want %d", len(added), depth+1)
	}
	if len(modified) != 1 || modified[0].Kind != Modified || modified[0].Path != strings.Repeat("d/", depth)+"f" {
		t.Errorf("modified: %d changes, want the one deep file", len(modified))
	}
	var patch bytes.Buffer
	if _, err := f.WritePatch(context.Background(), &patch, a, b, PatchOptions{}); err != nil || !strings.Contains(patch.String(), "-one\n+two\n") {
		t.Errorf("patch of the deep file: %v\n%.300s", err, patch.String())
	}
}

func TestDiffModeChange(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"x": "x\n", "y": "y\n"})
	a, err := f.Import(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "x"), 0o755)
	os.Chmod(filepath.Join(dir, "y"), 0o600)
	b, err := f.Import(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := f.Diff(ctx, a, b)
	if err != nil || len(ch) != 2 || ch[0].Kind != ModeChanged || ch[0].Path != "x" || ch[1].Path != "y" {
		t.Fatalf("diff = %+v, %v; want x and y mode-changed", ch, err)
	}
	var buf bytes.Buffer
	left, err := f.WritePatch(ctx, &buf, a, b, PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// 644 -> 600 is no change git can express: no header for it at all,
	// and it is reported.
	if want := "diff --git a/x b/x\nold mode 100644\nnew mode 100755\n"; buf.String() != want {
		t.Errorf("patch = %q, want %q", buf.String(), want)
	}
	if len(left) != 1 || left[0].Path != "y" || !strings.Contains(left[0].Reason, "0600") {
		t.Errorf("left out = %+v, want y's mode 0600", left)
	}
}

// patchTrees are the two sides of the git round trip: every kind of change
// a patch carries.
var patchA = map[string]string{
	"keep":           "keep\n",
	"edit":           "a\nb\nc\n" + strings.Repeat("line\n", 50) + "d\ne\n",
	"gone":           "bye\n",
	"gonebin":        "\x00\x01\x02gone",
	"odd\nname":      "x\n",
	"tab\tname":      "t\n",
	"nonl":           "no newline",
	"dir/inner":      "inner\n",
	"link":           "->keep",
	"bin":            "a\x00b" + strings.Repeat("\x00\xff", 3000),
	"exec":           "#!/bin/sh\n",
	"modeonly":       "same\n",
	"renamed":        "moved content\n",
	"filetodir":      "was a file\n",
	"dirtofile/x":    "was in a dir\n",
	"filetolink":     "plain\n",
	"big":            strings.Repeat("big text line\n", 100000),
	"empty":          "",
	"\xffodd\x01byt": "bytes\n",
}

var patchB = map[string]string{
	"keep":           "keep\n",
	"edit":           "a\nB\nc\n" + strings.Repeat("line\n", 50) + "d\nE\nf\n",
	"odd\nname":      "y\n",
	"tab\tname":      "t\n",
	"nonl":           "no newline either",
	"dir/inner":      "inner\n",
	"dir/added":      "added\n",
	"link":           "->edit",
	"bin":            "a\x00c" + strings.Repeat("\x00\xfe", 3000),
	"newbin":         "\x89PNG\x00\x00" + strings.Repeat("\x01\x02\x03", 1000),
	"exec":           "#!/bin/sh\necho\n",
	"modeonly":       "same\n",
	"moved/renamed":  "moved content\n",
	"filetodir/in":   "now a dir\n",
	"dirtofile":      "now a file\n",
	"filetolink":     "->keep",
	"big":            strings.Repeat("big text line\n", 100000) + "more\n",
	"newempty":       "",
	"\xffodd\x01byt": "bytes!\n",
}

// writePatchTree writes files and sets the modes the round trip uses.
func writePatchTree(t *testing.T, dir string, files map[string]string, after bool) {
	writeTree(t, dir, files)
	os.Chmod(filepath.Join(dir, "exec"), 0o755)
	if after {
		os.Chmod(filepath.Join(dir, "modeonly"), 0o755)
		os.Chmod(filepath.Join(dir, "newbin"), 0o755)
	}
}

// dirState describes a directory for comparison: type, exec bit and
// content or target of every path below it.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." || rel == ".git" || strings.HasPrefix(rel, ".git/") {
			if rel == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			out[rel] = "dir"
		case info.Mode()&fs.ModeSymlink != 0:
			tgt, _ := os.Readlink(p)
			out[rel] = "link " + tgt
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file x=%v %q", info.Mode()&0o111 != 0, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPatchAppliesWithGit(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	adir, bdir := t.TempDir(), t.TempDir()
	writePatchTree(t, adir, patchA, false)
	writePatchTree(t, bdir, patchB, true)
	a, err := f.Import(ctx, adir, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Import(ctx, bdir, "")
	if err != nil {
		t.Fatal(err)
	}
	var patch bytes.Buffer
	left, err := f.WritePatch(ctx, &patch, a, b, PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("left out: %+v", left)
	}
	for _, want := range []string{"GIT binary patch\nliteral ", "new file mode 100755\nindex 0000000000000000000000000000000000000000..", "diff --git a/modeonly b/modeonly\nold mode 100644\nnew mode 100755\n"} {
		if !strings.Contains(patch.String(), want) {
			t.Errorf("patch lacks %q", want)
		}
	}
	work := t.TempDir()
	writePatchTree(t, work, patchA, false)
	for _, args := range [][]string{{"apply", "--check", "-"}, {"apply", "-"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = work
		cmd.Stdin = bytes.NewReader(patch.Bytes())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s\npatch:\n%.3000s", args, err, out, patch.String())
		}
	}
	got, want := dirState(t, work), dirState(t, bdir)
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%q after git apply = %.80s, want %.80s", p, got[p], w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%q is left after git apply", p)
		}
	}
}

// TestPatchIndexMatchesGit checks the index lines against git's own blob
// ids.
func TestPatchIndexMatchesGit(t *testing.T) {
	f := openTestFS(t)
	content := "a\x00binary\xff" + strings.Repeat("z", 2<<20)
	a := importTree(t, f, map[string]string{})
	b := importTree(t, f, map[string]string{"f": content})
	var patch bytes.Buffer
	if _, err := f.WritePatch(context.Background(), &patch, a, b, PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("git", "hash-object", "--stdin")
	cmd.Stdin = strings.NewReader(content)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "index 0000000000000000000000000000000000000000.." + strings.TrimSpace(string(out)) + "\n"; !strings.Contains(patch.String(), want) {
		t.Errorf("patch lacks %q:\n%.300s", want, patch.String())
	}
}

// TestPatchTooBig: a sparse file of 100 GiB fails the patch at once, naming
// the file, with no read of its content.
func TestPatchTooBig(t *testing.T) {
	f := openTestFS(t)
	a := putTree(t, f, []tn{{name: "small", data: "x\n"}})
	var refs []chunkstore.Ref
	for i := 0; i < 100; i++ {
		refs = append(refs, chunkstore.Ref{Size: 1 << 30})
	}
	b := putTree(t, f, []tn{{name: "small", data: "y\n"}, {name: "sparse", refs: refs}})
	var buf bytes.Buffer
	var err error
	alloc := allocDuring(func() { _, err = f.WritePatch(context.Background(), &buf, a, b, PatchOptions{}) })
	if !errors.Is(err, ErrPatchTooBig) || !strings.Contains(err.Error(), "sparse") || !strings.Contains(err.Error(), "export-tar") {
		t.Errorf("patch of a 100 GiB file: %v", err)
	}
	if buf.Len() != 0 {
		t.Errorf("a failed patch wrote %d bytes", buf.Len())
	}
	if alloc > 16<<20 {
		t.Errorf("patch allocated %d bytes", alloc)
	}
	// The limit is the caller's to raise or lower.
	if _, err := f.WritePatch(context.Background(), &buf, a, a, PatchOptions{MaxFile: 1}); err != nil {
		t.Error(err)
	}
	c := putTree(t, f, []tn{{name: "small", data: "abc\n"}})
	if _, err := f.WritePatch(context.Background(), &buf, a, c, PatchOptions{MaxFile: 3}); !errors.Is(err, ErrPatchTooBig) {
		t.Errorf("4-byte file under a 3-byte limit: %v", err)
	}
}

// TestPatchBinaryBounded streams a 48 MiB binary file into a patch with
// bounded memory, and git applies it.
func TestPatchBinaryBounded(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	dir := t.TempDir()
	big := make([]byte, 48<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>13)
	}
	os.WriteFile(filepath.Join(dir, "blob"), big, 0o644)
	a := importTree(t, f, map[string]string{})
	b, err := f.Import(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	pf, err := os.Create(filepath.Join(t.TempDir(), "p"))
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	alloc := allocDuring(func() { _, err = f.WritePatch(ctx, pf, a, b, PatchOptions{}) })
	if err != nil {
		t.Fatal(err)
	}
	if alloc > 24<<20 {
		t.Errorf("patch of a 48 MiB file allocated %d MiB", alloc>>20)
	}
	work := t.TempDir()
	cmd := exec.Command("git", "apply", pf.Name())
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git apply: %v\n%s", err, out)
	}
	if got, err := os.ReadFile(filepath.Join(work, "blob")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("git apply made %d bytes (%v), want the 48 MiB file", len(got), err)
	}
}

// TestPatchLeavesOut: fifos, devices and sockets get no header (they used
// to show as "new file mode 100644") and are reported instead.
func TestPatchLeavesOut(t *testing.T) {
	f := openTestFS(t)
	a := putTree(t, f, []tn{{name: "oldfifo", e: Entry{Type: TypeFifo}}, {name: "own", data: "o\n", e: Entry{UID: 1}}})
	b := putTree(t, f, []tn{
		{name: "fifo", e: Entry{Type: TypeFifo}},
		{name: "dev", e: Entry{Type: TypeChar, Rdev: 1<<8 | 3}},
		{name: "sock", e: Entry{Type: TypeSocket}},
		{name: "private", data: "p\n", e: Entry{Mode: 0o600}},
		{name: "own", data: "o\n", e: Entry{UID: 2}},
	})
	var buf bytes.Buffer
	left, err := f.WritePatch(context.Background(), &buf, a, b, PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, l := range left {
		paths = append(paths, l.Path)
	}
	if want := []string{"dev", "fifo", "oldfifo", "own", "private", "sock"}; !slices.Equal(paths, want) {
		t.Errorf("left out %q, want %q (%+v)", paths, want, left)
	}
	if want := "diff --git a/private b/private\nnew file mode 100644\n"; !strings.HasPrefix(buf.String(), want) || strings.Count(buf.String(), "diff --git") != 1 {
		t.Errorf("patch = %q, want only private", buf.String())
	}
}

func TestDiffWithGitInternals(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	a := importTree(t, f, map[string]string{".git/index": "1", "src/x": "x", "sub/.git": "gitdir: ../.git/modules/sub", "sub/y": "y"})
	b := importTree(t, f, map[string]string{".git/index": "2", ".git/objects/ab/cd": "o", "src/x": "x2", "sub/.git": "gitdir: elsewhere", "sub/y": "y2", "a.git/k": "k"})
	paths := func(opts DiffOptions) []string {
		ch, err := f.DiffWith(ctx, a, b, opts)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range ch {
			out = append(out, c.Kind.String()+" "+c.Path)
		}
		return out
	}
	if got, want := paths(DiffOptions{}), []string{"added a.git", "added a.git/k", "modified src/x", "modified sub/y"}; !slices.Equal(got, want) {
		t.Errorf("default diff = %q, want %q", got, want)
	}
	if got := paths(DiffOptions{GitInternals: true}); !slices.Contains(got, "modified .git/index") || !slices.Contains(got, "modified sub/.git") {
		t.Errorf("diff with git internals = %q", got)
	}
	var patch bytes.Buffer
	if _, err := f.WritePatch(ctx, &patch, a, b, PatchOptions{}); err != nil || strings.Contains(patch.String(), "a/.git/") || strings.Contains(patch.String(), "sub/.git") {
		t.Errorf("patch carries .git: %v\n%s", err, patch.String())
	}
}

func TestDiffWithGitIgnore(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	a := importTree(t, f, map[string]string{"keep": "k"})
	b := importTree(t, f, map[string]string{
		"keep":                  "k",
		".gitignore":            "*.o\n/build/\n!keep.o\nlogs/**\ndeep/**/tmp\n# comment\n\\#hash\n",
		"x.o":                   "o",
		"keep.o":                "o",
		"build/out":             "b",
		"src/build/out":         "not anchored",
		"src/y.o":               "o",
		"src/.gitignore":        "!y.o\nlocal\n",
		"src/local":             "l",
		"local":                 "top local is kept",
		"logs/a/b":              "l",
		"deep/tmp":              "t",
		"deep/x/y/tmp":          "t",
		"deep/x/y/keep":         "k",
		"#hash":                 "h",
		"ignoreddir/.gitignore": "!*\n",
	})
	b2 := importTree(t, f, map[string]string{"keep": "k", ".gitignore": "ignoreddir/\n", "ignoreddir/.gitignore": "!*\n", "ignoreddir/z": "z"})
	paths := func(b SnapshotID) []string {
		ch, err := f.DiffWith(ctx, a, b, DiffOptions{GitIgnore: true})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range ch {
			out = append(out, c.Path)
		}
		return out
	}
	want := []string{".gitignore", "deep", "deep/x", "deep/x/y", "deep/x/y/keep", "ignoreddir", "ignoreddir/.gitignore", "keep.o", "local", "logs", "src", "src/.gitignore", "src/build", "src/build/out", "src/y.o"}
	if got := paths(b); !slices.Equal(got, want) {
		t.Errorf("gitignore diff:\n got %q\nwant %q", got, want)
	}
	// A directory that is ignored cannot have files re-included.
	if got, want := paths(b2), []string{".gitignore"}; !slices.Equal(got, want) {
		t.Errorf("ignored directory: got %q, want %q", got, want)
	}
}

// decodeBinaryLines decodes the base85 lines of one binary hunk back to
// the deflated bytes, as git apply reads them.
func decodeBinaryLines(lines []string) ([]byte, error) {
	var out []byte
	for _, l := range lines {
		if len(l) < 6 {
			return nil, fmt.Errorf("line %q is too short", l)
		}
		var n int
		switch c := l[0]; {
		case c >= 'A' && c <= 'Z':
			n = int(c-'A') + 1
		case c >= 'a' && c <= 'z':
			n = int(c-'a') + 27
		default:
			return nil, fmt.Errorf("bad length byte %q", c)
		}
		body := l[1:]
		if len(body) != (n+3)/4*5 {
			return nil, fmt.Errorf("%d characters for %d bytes", len(body), n)
		}
		for i := 0; i < len(body); i += 5 {
			var acc uint64
			for j := 0; j < 5; j++ {
				d := strings.IndexByte(b85Alphabet, body[i+j])
				if d < 0 {
					return nil, fmt.Errorf("bad character %q", body[i+j])
				}
				acc = acc*85 + uint64(d)
			}
			if acc > 0xffffffff {
				return nil, errors.New("group overflows")
			}
			for j := 0; j < 4 && n > 0; j++ {
				out = append(out, byte(acc>>(24-8*j)))
				n--
			}
		}
	}
	return out, nil
}

// FuzzBinaryHunk encodes data as a git binary hunk and decodes it back.
func FuzzBinaryHunk(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("a\x00b"))
	f.Add(bytes.Repeat([]byte{0xff}, 200))
	f.Fuzz(func(t *testing.T, data []byte) {
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		if err := writeBinaryHunk(w, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		lines := strings.Split(buf.String(), "\n")
		if lines[0] != fmt.Sprintf("literal %d", len(data)) || lines[len(lines)-1] != "" || lines[len(lines)-2] != "" {
			t.Fatalf("hunk framing: %q", buf.String())
		}
		for _, l := range lines[1 : len(lines)-2] {
			if len(l) > 66 {
				t.Fatalf("line of %d characters", len(l))
			}
		}
		z, err := decodeBinaryLines(lines[1 : len(lines)-2])
		if err != nil {
			t.Fatal(err)
		}
		zr, err := zlib.NewReader(bytes.NewReader(z))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round trip: %v, %q != %q", err, got, data)
		}
	})
}
