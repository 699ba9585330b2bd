package cowfs

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"path"
	"strconv"
	"strings"
	"testing"
)

// FuzzWriteTar builds a snapshot from fuzzed entries (names, types, modes,
// symlink targets, file bytes and user xattrs: all a sandbox chooses),
// exports it as a tar of changes and reads the archive back with
// archive/tar. The archive must parse whole; every name in it is a
// relative path of the tree (a whiteout's aside) with no "..", and no
// entry lies below a symlink the archive made earlier; file bytes, link
// targets and user xattrs come back as written, and what a tar cannot
// hold (a NUL in a link target, = in an xattr name) is refused, not fatal.
func FuzzWriteTar(f *testing.F) {
	rec := func(typ byte, name, payload string) string {
		return string([]byte{typ, byte(len(name))}) + name + string([]byte{byte(len(payload))}) + payload
	}
	f.Add([]byte(rec(0, "hello", "hi")))
	f.Add([]byte(rec(1, "d", "") + rec(0, "d/f", "abc") + rec(2, "link", "../..")))
	f.Add([]byte(rec(0, "a\nb\"c\\", "x") + rec(2, "s", "/etc/passwd") + rec(3, "fifo", "")))
	f.Add([]byte(rec(0, ".wh.x", "w") + rec(2, "l", ".") + rec(0, "l/in", "z")))
	f.Add([]byte(rec(1, "d", "") + rec(2, "d/l", "/") + rec(1, "e", "") + rec(0, "e/\x7f\xff", "")))
	f.Add([]byte(rec(0, "eq", "a=b") + rec(2, "nul", "x\x00y")))
	fs := openTestFS(f)
	ctx := context.Background()
	base, err := fs.Import(ctx, f.TempDir(), "")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		type want struct {
			typ    EntryType
			body   string
			xattrs map[string]string
		}
		var edits []TreeEdit
		wants := map[string]want{}
		for len(data) >= 3 && len(edits) < 8 {
			typ := EntryType(data[0]%4 + 1) // file, dir, symlink, fifo
			n := int(data[1])
			if len(data) < 2+n+1 {
				break
			}
			name := string(data[2 : 2+n])
			data = data[2+n:]
			m := int(data[0])
			if len(data) < 1+m {
				break
			}
			payload := data[1 : 1+m]
			data = data[1+m:]
			e := Entry{Name: path.Base(name), Type: typ, Mode: 0o644, Nlink: 1}
			w := want{typ: typ}
			switch typ {
			case TypeFile:
				var err error
				xn := "user." + string(payload[:min(len(payload), 4)])
				e.Xattrs = []Xattr{{Name: xn, Value: payload}}
				if e, err = fs.PutFileData(ctx, payload, e); err != nil {
					t.Fatal(err)
				}
				w.body, w.xattrs = string(payload), map[string]string{}
				if !strings.ContainsAny(xn, "=\x00") {
					w.xattrs[xn] = string(payload)
				}
			case TypeDir:
				e.Mode = 0o755
			case TypeSymlink:
				e.Target, e.Size = string(payload), int64(len(payload))
				w.body = string(payload)
				if bytes.IndexByte(payload, 0) >= 0 {
					w.typ = 0 // refused: no symlink can hold it
				}
			}
			edits = append(edits, TreeEdit{Path: name, Entry: &e})
			wants[name] = w
		}
		snap, err := fs.EditSnapshot(ctx, base, edits)
		if err != nil {
			return // names the tree refuses (empty, "..", a slash too many)
		}
		defer fs.DeleteSnapshot(ctx, snap)
		var buf bytes.Buffer
		if _, err := fs.WriteTar(ctx, &buf, base, snap, TarOptions{}); err != nil {
			t.Fatalf("write tar: %v", err)
		}
		tr := tar.NewReader(&buf)
		var links []string
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("the archive does not parse: %v", err)
			}
			if h.Name == "" || strings.HasPrefix(h.Name, "/") || path.Clean(h.Name) != strings.TrimSuffix(h.Name, "/") {
				t.Fatalf("archive name %q is not a clean relative path", h.Name)
			}
			for _, p := range strings.Split(h.Name, "/") {
				if p == ".." {
					t.Fatalf("archive name %q climbs out", h.Name)
				}
			}
			for _, l := range links {
				if strings.HasPrefix(h.Name, l+"/") {
					t.Fatalf("entry %q lies below the symlink %q written before it", h.Name, l)
				}
			}
			if strings.HasPrefix(path.Base(h.Name), whiteoutPrefix) {
				continue
			}
			w, ok := wants[strings.TrimSuffix(h.Name, "/")]
			if ok && w.typ == 0 {
				t.Fatalf("archive holds %q, which it should refuse", h.Name)
			}
			if !ok {
				if h.Typeflag == tar.TypeDir {
					continue // a parent the edit made
				}
				t.Fatalf("archive entry %q was not written", h.Name)
			}
			switch w.typ {
			case TypeFile:
				b, err := io.ReadAll(tr)
				if err != nil || string(b) != w.body {
					t.Fatalf("file %q reads %q (%v), want %q", h.Name, b, err, w.body)
				}
				for k, v := range h.PAXRecords {
					if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok && w.xattrs[x] != v {
						t.Fatalf("file %q has xattr %q = %q, want %q", h.Name, x, v, w.xattrs[x])
					}
				}
				for x, v := range w.xattrs {
					if got, ok := h.PAXRecords["SCHILY.xattr."+x]; !ok || got != v {
						t.Fatalf("file %q lost xattr %q (%q, want %q)", h.Name, x, got, v)
					}
				}
			case TypeSymlink:
				if h.Typeflag != tar.TypeSymlink || h.Linkname != w.body {
					t.Fatalf("symlink %q -> %q (type %c), want -> %q", h.Name, h.Linkname, h.Typeflag, w.body)
				}
				links = append(links, h.Name)
			}
		}
	})
}

// FuzzQuotePath: a path a sandbox names, quoted for a patch's headers,
// holds no control byte (a newline would start a header of its own) and
// unquotes, as git and Go read C-style quotes, to the path.
func FuzzQuotePath(f *testing.F) {
	for _, s := range []string{"a/b", "a b", "new\nline", "\"q\"", "back\\slash", "\x7f\xff\x00", "tab\there"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		q := quotePath(p)
		for i := 0; i < len(q); i++ {
			if q[i] < 0x20 || q[i] == 0x7f {
				t.Fatalf("quotePath(%q) = %q holds control byte %#x", p, q, q[i])
			}
		}
		if q == p {
			return
		}
		if u, err := strconv.Unquote(q); err != nil || u != p {
			t.Fatalf("quotePath(%q) = %q unquotes to %q (%v)", p, q, u, err)
		}
	})
}
