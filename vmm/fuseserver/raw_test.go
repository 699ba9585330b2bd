package fuseserver

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// TestExportImport serves a tree, exports the tables, copies the tree, and
// checks that a server of the copy answers the same ids with the copy's data.
func TestExportImport(t *testing.T) {
	a := t.TempDir()
	s := newServer(t, a)
	d := mkdir(t, s, rootID, "d")
	f, fh := create(t, s, d, "f", unix.O_RDWR)
	write(t, s, fh, 0, "hello parent")
	in := fuse.RenameIn{InHeader: hdr(d), Newdir: d}
	if code := s.Rename(never, &in, "f", "g"); !code.Ok() {
		t.Fatal(code)
	}
	_, goneFh := create(t, s, rootID, "gone", unix.O_WRONLY)
	tmp := lookup(t, s, rootID, "d")
	if tmp != d {
		t.Fatalf("second lookup of d: %d, want %d", tmp, d)
	}
	writeFile(t, filepath.Join(a, "d", "sub", "x"), "x")
	sub := lookup(t, s, d, "sub")
	s.Forget(sub, 1)
	if s.nodes[sub] != nil {
		t.Fatal("forgotten node stays in the table")
	}
	var oo fuse.OpenOut
	if code := s.OpenDir(never, &fuse.OpenIn{InHeader: hdr(d)}, &oo); !code.Ok() {
		t.Fatal(code)
	}
	dirFh := oo.Fh

	state, err := s.Export()
	if err != nil {
		t.Fatal(err)
	}
	nextNode := binary.LittleEndian.Uint64(state[8:])
	nextHandle := binary.LittleEndian.Uint64(state[16:])

	b := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", a, b).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	writeFile(t, filepath.Join(b, "d", "g"), "hello copy!!")
	if err := os.Remove(filepath.Join(b, "gone")); err != nil {
		t.Fatal(err)
	}

	s2 := newServer(t, b)
	if err := s2.Import(state); err != nil {
		t.Fatal(err)
	}
	var ao fuse.AttrOut
	if code := s2.GetAttr(never, &fuse.GetAttrIn{InHeader: hdr(d)}, &ao); !code.Ok() || ao.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Fatalf("getattr of imported dir: %v %o", code, ao.Mode)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(b, "d"), &st); err != nil || st.Ino != ao.Ino {
		t.Fatalf("imported dir ino %d, copy's %d (%v)", ao.Ino, st.Ino, err)
	}
	if got := lookup(t, s2, d, "g"); got != f {
		t.Fatalf("lookup under imported dir: %d, want %d", got, f)
	}
	if got, code := read(s2, fh, 0, 100); !code.Ok() || got != "hello copy!!" {
		t.Fatalf("read through imported handle: %q %v", got, code)
	}
	write(t, s2, fh, 0, "HELLO")
	if got := readFile(t, filepath.Join(b, "d", "g")); got != "HELLO copy!!" {
		t.Fatalf("copy after write: %q", got)
	}
	if got := readFile(t, filepath.Join(a, "d", "g")); got != "hello parent" {
		t.Fatalf("original after write to the copy: %q", got)
	}
	if got, code := read(s, fh, 0, 100); !code.Ok() || got != "hello parent" {
		t.Fatalf("parent server's read: %q %v", got, code)
	}

	nid, nfh := create(t, s2, rootID, "new", unix.O_RDWR)
	if nid < nextNode || nfh < nextHandle {
		t.Fatalf("new ids %d, %d not above exported counters %d, %d", nid, nfh, nextNode, nextHandle)
	}
	if _, code := read(s2, goneFh, 0, 10); code.Ok() {
		t.Fatal("read of a handle whose file is gone succeeded")
	}
	in2 := fuse.WriteIn{Fh: goneFh, Size: 1}
	if _, code := s2.Write(never, &in2, []byte("x")); code != fuse.EIO {
		t.Fatalf("write of a gone handle: %v, want EIO", code)
	}
	release(s2, goneFh)
	if _, code := read(s2, goneFh, 0, 10); code != fuse.EBADF {
		t.Fatalf("read after release: %v", code)
	}

	var names []string
	for _, e := range listAll(t, s2, dirFh, true) {
		names = append(names, e.Name)
	}
	sort.Strings(names)
	if want := []string{".", "..", "g", "sub"}; !slices.Equal(names, want) {
		t.Fatalf("imported dir handle lists %v, want %v", names, want)
	}
	s2.ReleaseDir(&fuse.ReleaseIn{Fh: dirFh})

	// Unknown ids answer errors.
	if code := s2.GetAttr(never, &fuse.GetAttrIn{InHeader: hdr(1 << 40)}, &ao); code != fuse.ENOENT {
		t.Fatalf("getattr of unknown node: %v", code)
	}
	if _, code := read(s2, 1<<40, 0, 1); code != fuse.EBADF {
		t.Fatalf("read of unknown fh: %v", code)
	}
	release(s2, fh)
	release(s2, nfh)
	release(s, fh)
	release(s, goneFh)
}

// TestUnlinkedOpenFile keeps using an open handle after its name is gone.
func TestUnlinkedOpenFile(t *testing.T) {
	s := newServer(t, t.TempDir())
	id, fh := create(t, s, rootID, "f", unix.O_RDWR)
	write(t, s, fh, 0, "abc")
	h := hdr(rootID)
	if code := s.Unlink(never, &h, "f"); !code.Ok() {
		t.Fatal(code)
	}
	var ao fuse.AttrOut
	if code := s.GetAttr(never, &fuse.GetAttrIn{InHeader: hdr(id)}, &ao); !code.Ok() || ao.Size != 3 {
		t.Fatalf("getattr of unlinked open file: %v size %d", code, ao.Size)
	}
	write(t, s, fh, 3, "def")
	if got, code := read(s, fh, 0, 10); !code.Ok() || got != "abcdef" {
		t.Fatalf("read: %q %v", got, code)
	}
	if code := s.Open(never, &fuse.OpenIn{InHeader: hdr(id)}, &fuse.OpenOut{}); code != fuse.ENOENT {
		t.Fatalf("open of an unlinked node by path: %v", code)
	}
	release(s, fh)
	s.Forget(id, 1)
	if len(s.nodes) != 1 {
		t.Fatalf("nodes left: %d", len(s.nodes))
	}
}

// TestBigDirRaw lists 10,000 entries through small READDIR replies.
func TestBigDirRaw(t *testing.T) {
	root := t.TempDir()
	for i := range 10000 {
		if err := os.WriteFile(filepath.Join(root, "f"+strconv.Itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := newServer(t, root)
	for _, plus := range []bool{false, true} {
		var oo fuse.OpenOut
		if code := s.OpenDir(never, &fuse.OpenIn{InHeader: hdr(rootID)}, &oo); !code.Ok() {
			t.Fatal(code)
		}
		seen := map[string]bool{}
		for _, e := range listAll(t, s, oo.Fh, plus) {
			if seen[e.Name] {
				t.Fatalf("duplicate %q", e.Name)
			}
			seen[e.Name] = true
		}
		if len(seen) != 10002 {
			t.Fatalf("plus=%v: %d entries, want 10002", plus, len(seen))
		}
		s.ReleaseDir(&fuse.ReleaseIn{Fh: oo.Fh})
	}
}

// TestRenameFlags checks RENAME_NOREPLACE and that RENAME_EXCHANGE swaps the
// two nodes in the table.
func TestRenameFlags(t *testing.T) {
	dir := t.TempDir()
	s := newServer(t, dir)
	a := mkdir(t, s, rootID, "a")
	fa, fha := create(t, s, a, "x", unix.O_RDWR)
	fb, fhb := create(t, s, rootID, "y", unix.O_RDWR)
	write(t, s, fha, 0, "in a")
	write(t, s, fhb, 0, "at root")
	if code := s.Rename(never, &fuse.RenameIn{InHeader: hdr(a), Newdir: rootID, Flags: unix.RENAME_NOREPLACE}, "x", "y"); code.Ok() {
		t.Fatal("RENAME_NOREPLACE over an existing name succeeded")
	}
	if code := s.Rename(never, &fuse.RenameIn{InHeader: hdr(a), Newdir: rootID, Flags: unix.RENAME_EXCHANGE}, "x", "y"); !code.Ok() {
		t.Fatal(code)
	}
	if got := lookup(t, s, rootID, "y"); got != fa {
		t.Fatalf("root/y is node %d, want %d", got, fa)
	}
	if got := lookup(t, s, a, "x"); got != fb {
		t.Fatalf("a/x is node %d, want %d", got, fb)
	}
	if got := readFile(t, filepath.Join(dir, "y")); got != "in a" {
		t.Fatalf("root/y holds %q", got)
	}
	// A plain rename over an existing name detaches the node that was there.
	if code := s.Rename(never, &fuse.RenameIn{InHeader: hdr(rootID), Newdir: a}, "y", "x"); !code.Ok() {
		t.Fatal(code)
	}
	if s.nodes[fb].parent != nil {
		t.Fatal("replaced node is still in the tree")
	}
	var ao fuse.AttrOut
	if code := s.GetAttr(never, &fuse.GetAttrIn{InHeader: hdr(fb)}, &ao); !code.Ok() || ao.Size != 7 {
		t.Fatalf("getattr of the replaced, still open node: %v size %d", code, ao.Size)
	}
	release(s, fha)
	release(s, fhb)
}

// TestConcurrent runs lookups, creates, forgets, renames and exports at once.
func TestConcurrent(t *testing.T) {
	s := newServer(t, t.TempDir())
	d := mkdir(t, s, rootID, "d")
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 200 {
				name := "f" + strconv.Itoa(g) + "-" + strconv.Itoa(i%10)
				var co fuse.CreateOut
				in := fuse.CreateIn{InHeader: hdr(d), Flags: unix.O_RDWR, Mode: 0o644}
				if code := s.Create(never, &in, name, &co); !code.Ok() {
					t.Error(code)
					return
				}
				s.Write(never, &fuse.WriteIn{Fh: co.Fh, Size: 1}, []byte("x"))
				var eo fuse.EntryOut
				h := hdr(d)
				s.Lookup(never, &h, name, &eo)
				s.Rename(never, &fuse.RenameIn{InHeader: hdr(d), Newdir: rootID}, name, name)
				if _, err := s.Export(); err != nil {
					t.Error(err)
				}
				release(s, co.Fh)
				s.Forget(co.NodeId, 1)
				s.Forget(eo.NodeId, 1)
				h = hdr(rootID)
				s.Unlink(never, &h, name)
			}
		}()
	}
	for range 8 {
		<-done
	}
	state, err := s.Export()
	if err != nil {
		t.Fatal(err)
	}
	if err := bare().Import(state); err != nil {
		t.Fatal(err)
	}
	if len(s.nodes) != 2 || len(s.handles) != 0 {
		t.Fatalf("left %d nodes and %d handles, want 2 and 0", len(s.nodes), len(s.handles))
	}
}

// TestForgetKeepsParents keeps a forgotten directory while its child is
// known, and drops it once the child moves away.
func TestForgetKeepsParents(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "p", "c"), "c")
	s := newServer(t, dir)
	p := lookup(t, s, rootID, "p")
	c := lookup(t, s, p, "c")
	s.Forget(p, 1)
	if s.nodes[p] == nil {
		t.Fatal("parent of a known child was dropped")
	}
	if code := s.Rename(never, &fuse.RenameIn{InHeader: hdr(p), Newdir: rootID}, "c", "c2"); !code.Ok() {
		t.Fatal(code)
	}
	if s.nodes[p] != nil {
		t.Fatal("forgotten parent without children stays")
	}
	if got := lookup(t, s, rootID, "c2"); got != c {
		t.Fatalf("moved child is node %d, want %d", got, c)
	}
	s.Forget(c, 2)
	if len(s.nodes) != 1 {
		t.Fatalf("%d nodes left", len(s.nodes))
	}
}

func TestCopyFileRange(t *testing.T) {
	dir := t.TempDir()
	s := newServer(t, dir)
	_, a := create(t, s, rootID, "a", unix.O_RDWR)
	_, b := create(t, s, rootID, "b", unix.O_RDWR)
	write(t, s, a, 0, "0123456789")
	n, code := s.CopyFileRange(never, &fuse.CopyFileRangeIn{FhIn: a, OffIn: 2, FhOut: b, OffOut: 1, Len: 5})
	if !code.Ok() || n != 5 {
		t.Fatalf("copy_file_range: %d %v", n, code)
	}
	if got := readFile(t, filepath.Join(dir, "b")); got != "\x0023456" {
		t.Fatalf("b holds %q", got)
	}
	if _, code := s.CopyFileRange(never, &fuse.CopyFileRangeIn{FhIn: a, FhOut: 999, Len: 1}); code != fuse.EBADF {
		t.Fatalf("copy to an unknown fh: %v", code)
	}
	release(s, a)
	release(s, b)
}
