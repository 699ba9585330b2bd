package fuseserver

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// TestHostile sends a guest's worst requests and checks that nothing outside
// the root is touched and nothing panics.
func TestHostile(t *testing.T) {
	base := t.TempDir()
	const secret = "marker-fuseserver-hostile"
	marker := filepath.Join(base, secret)
	writeFile(t, marker, "secret")
	if err := os.Chmod(marker, 0o600); err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	if err := unix.Lstat(marker, &before); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat("/" + secret); err == nil {
		t.Fatalf("/%s exists before the test", secret)
	}
	s := newServer(t, root)
	h := hdr(rootID)
	var eo fuse.EntryOut
	var co fuse.CreateOut
	var ao fuse.AttrOut
	var oo fuse.OpenOut

	// Names that are not one component.
	bad := []string{"", ".", "..", "a/b", "../" + secret, "x\x00y", strings.Repeat("a", 256), "/" + secret}
	for _, name := range bad {
		checks := map[string]fuse.Status{
			"lookup":   s.Lookup(never, &h, name, &eo),
			"create":   s.Create(never, &fuse.CreateIn{InHeader: h, Flags: unix.O_RDWR, Mode: 0o644}, name, &co),
			"mkdir":    s.Mkdir(never, &fuse.MkdirIn{InHeader: h, Mode: 0o755}, name, &eo),
			"mknod":    s.Mknod(never, &fuse.MknodIn{InHeader: h, Mode: unix.S_IFREG | 0o644}, name, &eo),
			"symlink":  s.Symlink(never, &h, "/", name, &eo),
			"unlink":   s.Unlink(never, &h, name),
			"rmdir":    s.Rmdir(never, &h, name),
			"rename1":  s.Rename(never, &fuse.RenameIn{InHeader: h, Newdir: rootID}, name, "x"),
			"rename2":  s.Rename(never, &fuse.RenameIn{InHeader: h, Newdir: rootID}, "x", name),
			"link":     s.Link(never, &fuse.LinkIn{InHeader: h, Oldnodeid: rootID}, name, &eo),
			"mkdirTop": s.Mkdir(never, &fuse.MkdirIn{InHeader: hdr(rootID), Mode: 0o755}, name, &eo),
		}
		for op, code := range checks {
			if code.Ok() {
				t.Errorf("%s %q: accepted", op, name)
			}
		}
	}

	// Symlinks that point out, used as parents and as targets.
	links := map[string]string{
		"up": "..", "upup": "../..", "abs": base, "slash": "/",
		"m": marker, "mrel": "../" + secret,
	}
	ids := map[string]uint64{}
	for name, to := range links {
		if code := s.Symlink(never, &h, to, name, &eo); !code.Ok() {
			t.Fatalf("symlink %s: %v", name, code)
		}
		ids[name] = eo.NodeId
	}
	if code := s.Mkdir(never, &fuse.MkdirIn{InHeader: h, Mode: 0o755}, "d", &eo); !code.Ok() {
		t.Fatal(code)
	}
	d := eo.NodeId
	if code := s.Mkdir(never, &fuse.MkdirIn{InHeader: hdr(d), Mode: 0o755}, "e", &eo); !code.Ok() {
		t.Fatal(code)
	}
	e := eo.NodeId
	for name, id := range ids {
		ph := hdr(id)
		checks := map[string]fuse.Status{
			"lookup":   s.Lookup(never, &ph, secret, &eo),
			"create":   s.Create(never, &fuse.CreateIn{InHeader: ph, Flags: unix.O_WRONLY | unix.O_TRUNC, Mode: 0o644}, secret, &co),
			"createN":  s.Create(never, &fuse.CreateIn{InHeader: ph, Flags: unix.O_WRONLY, Mode: 0o644}, secret+"2", &co),
			"mkdir":    s.Mkdir(never, &fuse.MkdirIn{InHeader: ph, Mode: 0o755}, secret+"3", &eo),
			"mknod":    s.Mknod(never, &fuse.MknodIn{InHeader: ph, Mode: unix.S_IFIFO | 0o644}, secret+"4", &eo),
			"symlink":  s.Symlink(never, &ph, "x", secret+"5", &eo),
			"unlink":   s.Unlink(never, &ph, secret),
			"rename":   s.Rename(never, &fuse.RenameIn{InHeader: ph, Newdir: rootID}, secret, "stolen"),
			"renameIn": s.Rename(never, &fuse.RenameIn{InHeader: hdr(d), Newdir: id}, "e", secret+"6"),
			"link":     s.Link(never, &fuse.LinkIn{InHeader: ph, Oldnodeid: d}, secret+"7", &eo),
			"opendir":  s.OpenDir(never, &fuse.OpenIn{InHeader: ph}, &oo),
			"open":     s.Open(never, &fuse.OpenIn{InHeader: ph, Flags: unix.O_RDWR | unix.O_TRUNC}, &oo),
			"chmod":    s.SetAttr(never, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: ph, Valid: fuse.FATTR_MODE, Mode: 0o777}}, &ao),
			"truncate": s.SetAttr(never, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: ph, Valid: fuse.FATTR_SIZE}}, &ao),
		}
		for op, code := range checks {
			if code.Ok() {
				t.Errorf("%s under symlink %s: accepted", op, name)
			}
		}
		// Operations that apply to the link itself may succeed, but must not
		// reach its target.
		s.SetAttr(never, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: ph, Valid: fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_MTIME, Owner: fuse.Owner{Uid: 1234, Gid: 1234}, Mtime: 1}}, &ao)
		s.SetXAttr(never, &fuse.SetXAttrIn{InHeader: ph, Size: 1}, "user.x", []byte("x"))
		s.RemoveXAttr(never, &ph, "user.x")
		s.GetXAttr(never, &ph, "user.x", make([]byte, 10))
		if code := s.Link(never, &fuse.LinkIn{InHeader: h, Oldnodeid: id}, "hard-"+name, &eo); code.Ok() {
			if code := s.Open(never, &fuse.OpenIn{InHeader: hdr(eo.NodeId), Flags: unix.O_RDWR}, &oo); code.Ok() {
				t.Errorf("open of a hard link to symlink %s: accepted", name)
			}
		}
	}

	// A directory into itself, device nodes, unknown ids and handles.
	if code := s.Rename(never, &fuse.RenameIn{InHeader: h, Newdir: e}, "d", "loop"); code.Ok() {
		t.Error("rename of a directory into its child: accepted")
	}
	if code := s.Mknod(never, &fuse.MknodIn{InHeader: h, Mode: unix.S_IFCHR | 0o666, Rdev: 0x0103}, "null", &eo); code != fuse.EPERM {
		t.Errorf("mknod of a device: %v, want EPERM", code)
	}
	for _, id := range []uint64{0, 1 << 40, ^uint64(0)} {
		ih := hdr(id)
		if code := s.Lookup(never, &ih, "x", &eo); code.Ok() {
			t.Errorf("lookup under unknown node %d: accepted", id)
		}
		if code := s.GetAttr(never, &fuse.GetAttrIn{InHeader: ih}, &ao); code != fuse.ENOENT {
			t.Errorf("getattr of unknown node %d: %v", id, code)
		}
		s.Forget(id, 1)
		for _, fh := range []uint64{id, 7777} {
			if _, code := read(s, fh, 0, 10); code != fuse.EBADF {
				t.Errorf("read of unknown fh %d: %v", fh, code)
			}
			if _, code := s.Write(never, &fuse.WriteIn{Fh: fh, Size: 1}, []byte("x")); code != fuse.EBADF {
				t.Errorf("write of unknown fh %d: %v", fh, code)
			}
			s.Fsync(never, &fuse.FsyncIn{Fh: fh})
			s.Flush(never, &fuse.FlushIn{Fh: fh})
			s.Lseek(never, &fuse.LseekIn{Fh: fh, Whence: 99}, &fuse.LseekOut{})
			s.Fallocate(never, &fuse.FallocateIn{Fh: fh, Length: 1 << 62})
			s.ReadDir(never, &fuse.ReadIn{Fh: fh}, fuse.NewDirEntryList(make([]byte, 100), 0))
			s.ReadDirPlus(never, &fuse.ReadIn{Fh: fh}, fuse.NewDirEntryList(make([]byte, 100), 0))
			release(s, fh)
			s.ReleaseDir(&fuse.ReleaseIn{Fh: fh})
		}
	}
	s.Forget(rootID, 1<<60)
	if code := s.GetAttr(never, &fuse.GetAttrIn{InHeader: hdr(rootID)}, &ao); !code.Ok() {
		t.Errorf("root after forget: %v", code)
	}
	// A directory handle's entries stay beneath its directory.
	if code := s.OpenDir(never, &fuse.OpenIn{InHeader: h}, &oo); !code.Ok() {
		t.Fatal(code)
	}
	for _, ent := range listAll(t, s, oo.Fh, true) {
		if ent.Name == secret {
			t.Errorf("listing of the root shows %s", secret)
		}
	}
	// Reading a directory fh as a file, and a huge offset.
	if _, code := read(s, oo.Fh, 1<<63, 10); code.Ok() {
		t.Error("read of a directory handle: accepted")
	}
	s.ReleaseDir(&fuse.ReleaseIn{Fh: oo.Fh})

	var after unix.Stat_t
	if err := unix.Lstat(marker, &after); err != nil {
		t.Fatal(err)
	}
	if after.Mode != before.Mode || after.Uid != before.Uid || after.Gid != before.Gid || after.Size != before.Size ||
		after.Mtim != before.Mtim || after.Ctim != before.Ctim || after.Nlink != before.Nlink {
		t.Errorf("marker changed: %+v -> %+v", before, after)
	}
	if got := readFile(t, marker); got != "secret" {
		t.Errorf("marker now holds %q", got)
	}
	ents, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ent := range ents {
		names = append(names, ent.Name())
	}
	sort.Strings(names)
	if want := []string{secret, "root"}; !slices.Equal(names, want) {
		t.Errorf("outside the root: %v, want %v", names, want)
	}
	for _, suffix := range []string{"", "2", "3", "4", "5", "6", "7"} {
		if _, err := os.Lstat("/" + secret + suffix); err == nil {
			os.Remove("/" + secret + suffix)
			t.Errorf("/%s%s made", secret, suffix)
		}
	}
	if _, err := os.Lstat("/stolen"); err == nil {
		t.Error("/stolen made")
	}
}
