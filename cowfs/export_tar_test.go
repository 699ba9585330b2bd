package cowfs

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"tine/chunkstore"
)

// tarEntries reads an archive's headers and bodies (bodies of sparse
// files are not read).
func tarEntries(t *testing.T, data []byte) ([]*tar.Header, map[string]string) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	var hs []*tar.Header
	bodies := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hs, bodies
		}
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
		if h.Size < 1<<20 {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			bodies[h.Name] = string(b)
		}
	}
}

func TestWriteTar(t *testing.T) {
	f := openTestFS(t)
	a := importTree(t, f, map[string]string{"keep": "k", "gone": "g", "d/gone2": "g2", "edit": "1", "gonedir/x/y": "y"})
	big := strings.Repeat("0123456789", 100000)
	b := importTree(t, f, map[string]string{"keep": "k", "edit": "2", "d/new\nline": big, "sym": "->keep"})
	var buf bytes.Buffer
	res, err := f.WriteTar(context.Background(), &buf, a, b, TarOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"d/gone2", "gone", "gonedir", "gonedir/x", "gonedir/x/y"}; !slices.Equal(res.Deleted, want) {
		t.Errorf("deleted = %q, want %q", res.Deleted, want)
	}
	hs, got := tarEntries(t, buf.Bytes())
	var names []string
	for _, h := range hs {
		names = append(names, h.Name)
	}
	// One whiteout covers a deleted directory's contents.
	if want := []string{"d/.wh.gone2", "d/new\nline", "edit", ".wh.gone", ".wh.gonedir", "sym"}; !slices.Equal(names, want) {
		t.Errorf("entries %q, want %q", names, want)
	}
	if got["d/new\nline"] != big || got["edit"] != "2" {
		t.Errorf("bodies wrong")
	}
}

// extractors lists the tar extractors installed here: Python's tarfile
// (with no filter: it trusts the archive), GNU tar and bsdtar.
func extractors(t *testing.T) map[string]func(archive, dest string) error {
	out := map[string]func(archive, dest string) error{}
	run := func(name string, args ...string) error {
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Logf("%s %q: %v\n%s", name, args, err, out)
			return err
		}
		return nil
	}
	out["python-tarfile"] = func(archive, dest string) error {
		return run("python3", "-c", `import sys, tarfile
t = tarfile.open(sys.argv[1])
kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
t.extractall(sys.argv[2], **kw)`, archive, dest)
	}
	out["gnu-tar"] = func(archive, dest string) error { return run("tar", "-xf", archive, "-C", dest) }
	if _, err := exec.LookPath("bsdtar"); err == nil {
		out["bsdtar"] = func(archive, dest string) error { return run("bsdtar", "-xf", archive, "-C", dest) }
	}
	return out
}

// TestTarNoEscape: a directory replaced by a symlink pointing outside. The
// archive used to hold the symlink, then whiteouts below it, which
// extractors wrote through the symlink.
func TestTarNoEscape(t *testing.T) {
	f := openTestFS(t)
	a := importTree(t, f, map[string]string{"d/f": "f", "d/sub/g": "g", "e/h": "h", "z": "z"})
	b := importTree(t, f, map[string]string{"d": "->../outside", "e": "->/tmp", "a/l": "->..", "z": "->d", "zz/y": "y"})
	var buf bytes.Buffer
	if _, err := f.WriteTar(context.Background(), &buf, a, b, TarOptions{}); err != nil {
		t.Fatal(err)
	}
	hs, _ := tarEntries(t, buf.Bytes())
	var links []string
	for _, h := range hs {
		if h.Typeflag != tar.TypeSymlink && len(links) > 0 {
			t.Errorf("%q comes after symlink %q", h.Name, links[0])
		}
		for _, l := range links {
			if strings.HasPrefix(h.Name, l+"/") {
				t.Errorf("%q lies below symlink %q", h.Name, l)
			}
		}
		if h.Typeflag == tar.TypeSymlink {
			links = append(links, h.Name)
		}
	}
	archive := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(archive, buf.Bytes(), 0o644)
	for name, extract := range extractors(t) {
		t.Run(name, func(t *testing.T) {
			top := t.TempDir()
			dest := filepath.Join(top, "dest")
			os.Mkdir(dest, 0o755)
			if err := extract(archive, dest); err != nil {
				t.Fatal(err)
			}
			es, _ := os.ReadDir(top)
			if len(es) != 1 {
				t.Errorf("extraction wrote outside its directory: %v", es)
			}
			if tgt, err := os.Readlink(filepath.Join(dest, "d")); err != nil || tgt != "../outside" {
				t.Errorf("d = %q, %v", tgt, err)
			}
		})
	}
}

func TestTarPrivileges(t *testing.T) {
	f := openTestFS(t)
	a := putTree(t, f, nil)
	b := putTree(t, f, []tn{
		{name: "suid", data: "s", e: Entry{Mode: 0o4755, UID: 4321, GID: 4321, Xattrs: []Xattr{{"security.capability", []byte("cap")}, {"user.note", []byte("n")}}}},
		{name: "sgid", e: Entry{Type: TypeDir, Mode: 0o2775}},
		{name: "dev", e: Entry{Type: TypeChar, Mode: 0o666, Rdev: 1<<8 | 3}},
		{name: "fifo", e: Entry{Type: TypeFifo}},
		{name: "sock", e: Entry{Type: TypeSocket}},
		{name: ".wh.trick", data: "deletes a sibling in a layer"},
	})
	check := func(opts TarOptions, wantRefused []string, mode int64, uid int, dev bool) {
		t.Helper()
		var buf bytes.Buffer
		res, err := f.WriteTar(context.Background(), &buf, a, b, opts)
		if err != nil {
			t.Fatal(err)
		}
		var refused []string
		for _, r := range res.Refused {
			refused = append(refused, r.Path)
		}
		if !slices.Equal(refused, wantRefused) {
			t.Errorf("refused %q, want %q (%+v)", refused, wantRefused, res.Refused)
		}
		hs, _ := tarEntries(t, buf.Bytes())
		sawDev := false
		for _, h := range hs {
			switch h.Name {
			case "suid":
				if h.Mode != mode || h.Uid != uid || h.Gid != uid && uid != os.Getuid() {
					t.Errorf("suid: mode %o uid %d gid %d, want %o %d", h.Mode, h.Uid, h.Gid, mode, uid)
				}
				if _, ok := h.PAXRecords["SCHILY.xattr.security.capability"]; ok || h.PAXRecords["SCHILY.xattr.user.note"] != "n" {
					t.Errorf("suid xattrs: %v", h.PAXRecords)
				}
			case "sgid/":
				if h.Mode&0o2000 != mode&0o4000>>1 {
					t.Errorf("sgid dir mode %o", h.Mode)
				}
			case "dev":
				sawDev = true
			case ".wh.trick":
				t.Error("archive holds the sandbox's own .wh. name")
			}
		}
		if sawDev != dev {
			t.Errorf("device in archive: %v, want %v", sawDev, dev)
		}
	}
	check(TarOptions{}, []string{".wh.trick", "dev", "sock", "suid"}, 0o755, os.Getuid(), false)
	check(TarOptions{Privileges: HostPrivileges{SetID: true, Devices: true, Owners: true}}, []string{".wh.trick", "sock", "suid"}, 0o4755, 4321, true)
}

// TestTarSparse: a 1 TiB file of holes with a few bytes at each end makes
// a small archive with bounded memory, and every extractor recreates it
// sparse.
func TestTarSparse(t *testing.T) {
	f := openTestFS(t)
	ctx := context.Background()
	head, err := f.store.PutStream(ctx, strings.NewReader("head"))
	if err != nil {
		t.Fatal(err)
	}
	tail, err := f.store.PutStream(ctx, strings.NewReader("tail"))
	if err != nil {
		t.Fatal(err)
	}
	refs := append([]chunkstore.Ref(nil), head...)
	for i := 0; i < 1024; i++ {
		refs = append(refs, chunkstore.Ref{Size: 1 << 30})
	}
	refs = append(refs, tail...)
	refs = append(refs, chunkstore.Ref{Size: 100}) // ends in a hole
	const size = 4 + 1<<40 + 4 + 100
	a := putTree(t, f, nil)
	b := putTree(t, f, []tn{{name: "huge", refs: refs, e: Entry{Mode: 0o600}}, {name: "after", data: "after"}, {name: "holes", refs: []chunkstore.Ref{{Size: 5000}}}})
	archive := filepath.Join(t.TempDir(), "x.tar")
	out, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	alloc := allocDuring(func() { _, err = f.WriteTar(ctx, out, a, b, TarOptions{}) })
	out.Close()
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(archive)
	if st.Size() > 16<<10 || alloc > 8<<20 {
		t.Errorf("archive of a 1 TiB sparse file: %d bytes, %d bytes allocated", st.Size(), alloc)
	}
	data, _ := os.ReadFile(archive)
	hs, bodies := tarEntries(t, data)
	if len(hs) != 3 || hs[0].Name != "after" || hs[1].Name != "holes" || hs[1].Size != 5000 || bodies["holes"] != strings.Repeat("\x00", 5000) || hs[2].Name != "huge" || hs[2].Size != size || bodies["after"] != "after" {
		for _, h := range hs {
			t.Logf("%q size %d", h.Name, h.Size)
		}
		t.Fatalf("archive entries wrong")
	}
	for name, extract := range extractors(t) {
		t.Run(name, func(t *testing.T) {
			dest := t.TempDir()
			if err := extract(archive, dest); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dest, "huge")
			var st syscall.Stat_t
			if err := syscall.Stat(p, &st); err != nil {
				t.Fatal(err)
			}
			if st.Size != size || st.Blocks*512 > 1<<20 {
				t.Errorf("extracted huge: size %d, %d bytes on disk", st.Size, st.Blocks*512)
			}
			fd, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer fd.Close()
			got := make([]byte, 4)
			for off, want := range map[int64]string{0: "head", 4 + 1<<40: "tail", 100: "\x00\x00\x00\x00", size - 4: "\x00\x00\x00\x00"} {
				if _, err := fd.ReadAt(got, off); err != nil || string(got) != want {
					t.Errorf("at %d: %q, %v; want %q", off, got, err, want)
				}
			}
		})
	}
}

func TestUstarNumeric(t *testing.T) {
	f := make([]byte, 12)
	putNumeric(f, 1<<40)
	if string(f) != "20000000000000"[:11]+"\x00" {
		// 1<<40 is 20000000000000 in octal: 14 digits, more than fit.
		if f[0] != 0x80 {
			t.Errorf("field %q", f)
		}
	}
	putNumeric(f, 0o777)
	if string(f) != "00000000777\x00" {
		t.Errorf("field %q", f)
	}
	var b []byte
	b = appendPAXRecord(b, "k", strings.Repeat("v", 94)) // 98 bytes and "98 " make 100: three digits
	if !strings.HasPrefix(string(b), "101 k=") || len(b) != 101 {
		t.Errorf("record %q (%d bytes)", b[:8], len(b))
	}
}
