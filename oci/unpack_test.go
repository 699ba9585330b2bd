package oci_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	ti "tine/internal/testimage"
	"tine/oci"
)

// sandboxDirs makes base/root (to unpack into) and base/outside/secret,
// which nothing unpacked may reach.
func sandboxDirs(t testing.TB) (base, root string) {
	base = t.TempDir()
	root = filepath.Join(base, "root")
	os.Mkdir(root, 0o755)
	os.Mkdir(filepath.Join(base, "outside"), 0o755)
	os.WriteFile(filepath.Join(base, "outside", "secret"), []byte("secret"), 0o600)
	return base, root
}

// checkOutside fails unless base holds only root and outside/secret,
// unchanged.
func checkOutside(t testing.TB, base string) {
	t.Helper()
	var seen []string
	filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(base, p)
		if rel == "root" {
			return filepath.SkipDir
		}
		seen = append(seen, rel)
		return nil
	})
	if strings.Join(seen, " ") != ". outside outside/secret" {
		t.Fatalf("outside the rootfs now: %q", seen)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(base, "outside", "secret"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode != unix.S_IFREG|0o600 || st.Nlink != 1 || st.Uid != uint32(os.Getuid()) {
		t.Fatalf("outside/secret changed: mode %o links %d uid %d", st.Mode, st.Nlink, st.Uid)
	}
	if b, _ := os.ReadFile(filepath.Join(base, "outside", "secret")); string(b) != "secret" {
		t.Fatalf("outside/secret now holds %q", b)
	}
}

func layersOf(tars ...[]byte) []oci.Layer {
	var ls []oci.Layer
	for i, b := range tars {
		ls = append(ls, oci.Layer{Name: "layer" + string(rune('A'+i)), Open: func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		}})
	}
	return ls
}

func TestUnpackHostile(t *testing.T) {
	abs := func(base string) string { return filepath.Join(base, "outside") }
	dev := ti.Entry{Header: tar.Header{Typeflag: tar.TypeChar, Name: "dev/mem", Devmajor: 1, Devminor: 1, Mode: 0o666}}
	blk := ti.Entry{Header: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8, Mode: 0o666}}
	huge := ti.Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: "huge", Size: 1 << 40, Mode: 0o644}}
	setuid := ti.File("bin/su", "x", 0o4755)
	xattrs := ti.File("x", "x", 0o644)
	xattrs.PAXRecords = map[string]string{"SCHILY.xattr.user.keep": "1", "SCHILY.xattr.trusted.overlay.opaque": "y",
		"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}
	for _, tc := range []struct {
		name   string
		layers func(base string) [][]ti.Entry
		raw    []byte // one layer, as is
		lim    oci.Limits
		err    string // substring of the error; "" for none
		check  func(t *testing.T, root string)
	}{
		{name: "dotdot", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.File("../outside/secret", "pwned", 0o644)}}
		}, err: `entry "../outside/secret": name has a .. component`},
		{name: "dotdot inside", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.File("a/../../outside/x", "pwned", 0o644)}}
		}, err: ".. component"},
		{name: "absolute name", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.File(abs(base)+"/secret", "pwned", 0o644)}}
		}, check: func(t *testing.T, root string) {
			mustRead(t, filepath.Join(root, strings.TrimPrefix(filepath.Dir(root), "/"), "outside/secret"), "pwned")
		}},
		{name: "symlink parent absolute", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Dir(strings.TrimPrefix(abs(base), "/"), 0o755), ti.Symlink("evil", abs(base)), ti.File("evil/secret", "pwned", 0o644)}}
		}, check: func(t *testing.T, root string) {
			// Resolved as if root were /: the file lands inside.
			mustRead(t, filepath.Join(root, abs(filepath.Dir(root)), "secret"), "pwned")
		}},
		{name: "symlink parent relative", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Dir("d", 0o755), ti.Dir("outside", 0o755), ti.Symlink("d/up", "../../outside"), ti.File("d/up/secret", "pwned", 0o644)}}
		}, check: func(t *testing.T, root string) { mustRead(t, filepath.Join(root, "outside/secret"), "pwned") }},
		{name: "symlink parent in later layer", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Symlink("etc", abs(base))}, {ti.File("etc/secret", "pwned", 0o644)}}
		}, err: "not a directory"},
		{name: "symlink last component replaced", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Symlink("f", abs(base)+"/secret")}, {ti.File("f", "mine", 0o4755)}}
		}, check: func(t *testing.T, root string) {
			mustRead(t, filepath.Join(root, "f"), "mine")
			if st, err := os.Lstat(filepath.Join(root, "f")); err != nil || !st.Mode().IsRegular() {
				t.Errorf("f: %v %v", st, err)
			}
		}},
		{name: "symlink dir attrs not followed", layers: func(base string) [][]ti.Entry {
			d := ti.Dir("o", 0o777)
			d.Uid = 1234
			return [][]ti.Entry{{ti.Symlink("o", abs(base))}, {d}}
		}},
		{name: "hard link out by dotdot", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Hardlink("ln", "../outside/secret")}}
		}, err: "hard link target"},
		{name: "hard link out by absolute path", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Hardlink("ln", abs(base)+"/secret")}}
		}, err: "hard link target"},
		{name: "hard link through symlink parent", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Symlink("s", abs(base)), ti.Hardlink("ln", "s/secret")}}
		}, err: "hard link target"},
		{name: "hard link to symlink", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Symlink("s", abs(base)+"/secret"), ti.Hardlink("ln", "s")}}
		}, check: func(t *testing.T, root string) {
			if st, err := os.Lstat(filepath.Join(root, "ln")); err != nil || st.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("ln is not the symlink itself: %v %v", st, err)
			}
		}},
		{name: "hard link inside", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.File("a", "A", 0o644), ti.Hardlink("b", "/a")}}
		}, check: func(t *testing.T, root string) { mustRead(t, filepath.Join(root, "b"), "A") }},
		{name: "whiteout dotdot", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Dir("d", 0o755)}, {ti.File("d/../../outside/.wh.secret", "", 0)}}
		}, err: ".. component"},
		{name: "whiteout named dotdot", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Dir("d", 0o755)}, {ti.File("d/.wh...", "", 0)}}
		}, err: "whiteout names no entry"},
		{name: "whiteout through symlink", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Symlink("s", abs(base))}, {ti.File("s/.wh.secret", "", 0)}}
		}},
		{name: "opaque through symlink", layers: func(base string) [][]ti.Entry {
			return [][]ti.Entry{{ti.Symlink("s", abs(base))}, {ti.File("s/.wh..wh..opq", "", 0)}}
		}, err: "not a directory"},
		{name: "whiteouts apply to earlier layers only", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.File("d/old", "o", 0o644), ti.File("keep", "k", 0o644), ti.File("gone", "g", 0o644)},
				{ti.File("d/new", "n", 0o644), ti.File("d/.wh..wh..opq", "", 0), ti.File("x", "x", 0o644), ti.File(".wh.x", "", 0), ti.File(".wh.gone", "", 0)}}
		}, check: func(t *testing.T, root string) {
			mustRead(t, filepath.Join(root, "d/new"), "n")
			mustRead(t, filepath.Join(root, "x"), "x")
			mustRead(t, filepath.Join(root, "keep"), "k")
			for _, p := range []string{"d/old", "gone"} {
				if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s not whited out: %v", p, err)
				}
			}
		}},
		{name: "huge size", raw: hugeTar(t, huge),
			lim: oci.Limits{Bytes: 1 << 20}, err: `entry "huge": 1099511627776 bytes: more than the limit of 1048576`},
		{name: "bytes over all layers", layers: func(string) [][]ti.Entry {
			return [][]ti.Entry{{ti.File("a", strings.Repeat("a", 600), 0o644)}, {ti.File("b", strings.Repeat("b", 600), 0o644)}}
		}, lim: oci.Limits{Bytes: 1000}, err: `unpack layer 2 (layerB): entry "b"`},
		{name: "too many entries", layers: func(string) [][]ti.Entry {
			var es []ti.Entry
			for i := range 50 {
				es = append(es, ti.File("f"+string(rune('a'+i%26))+string(rune('a'+i/26)), "", 0o644))
			}
			return [][]ti.Entry{es}
		}, lim: oci.Limits{Entries: 10}, err: "more than the limit of 10 entries"},
		{name: "too many layers", layers: func(string) [][]ti.Entry { return make([][]ti.Entry, 5) },
			lim: oci.Limits{Layers: 4}, err: "5 layers, more than the limit of 4"},
		{name: "device nodes skipped", layers: func(string) [][]ti.Entry { return [][]ti.Entry{{dev, blk}} },
			check: func(t *testing.T, root string) {
				for _, p := range []string{"dev/mem", "sda"} {
					if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("device node %s made: %v", p, err)
					}
				}
			}},
		{name: "setuid kept only with its own owner", layers: func(string) [][]ti.Entry { return [][]ti.Entry{{setuid}} },
			check: func(t *testing.T, root string) {
				st, err := os.Stat(filepath.Join(root, "bin/su"))
				if err != nil {
					t.Fatal(err)
				}
				want := fs.FileMode(0o755)
				if os.Geteuid() == 0 {
					want |= fs.ModeSetuid
				}
				if st.Mode().Perm()|st.Mode()&fs.ModeSetuid != want || st.Sys().(*syscallStat).Uid != 0 && os.Geteuid() == 0 {
					t.Errorf("bin/su mode %v", st.Mode())
				}
			}},
		{name: "xattrs user only", layers: func(string) [][]ti.Entry { return [][]ti.Entry{{xattrs}} },
			check: func(t *testing.T, root string) {
				buf := make([]byte, 256)
				n, _ := unix.Llistxattr(filepath.Join(root, "x"), buf)
				names := strings.Split(strings.Trim(string(buf[:n]), "\x00"), "\x00")
				for _, x := range names {
					if x != "" && x != "user.keep" {
						t.Errorf("xattr %s kept", x)
					}
				}
			}},
		{name: "root not a directory", layers: func(string) [][]ti.Entry { return [][]ti.Entry{{ti.File(".", "x", 0o644)}} },
			err: "names the root"},
		{name: "short content", layers: func(string) [][]ti.Entry { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, root := sandboxDirs(t)
			var tars [][]byte
			if tc.raw != nil {
				tars = append(tars, tc.raw)
			}
			for _, l := range layersFn(tc.layers, base) {
				tars = append(tars, ti.Tar(t, l...))
			}
			_, err := oci.Unpack(context.Background(), root, layersOf(tars...), tc.lim)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("unpack: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("unpack: error %v, want one with %q", err, tc.err)
			}
			checkOutside(t, base)
			if tc.check != nil && err == nil {
				tc.check(t, root)
			}
		})
	}
}

func layersFn(f func(string) [][]ti.Entry, base string) [][]ti.Entry {
	if f == nil {
		return nil
	}
	return f(base)
}

// hugeTar is a tar stream whose one header claims more content than
// follows.
func hugeTar(t *testing.T, e ti.Entry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&e.Header); err != nil {
		t.Fatal(err)
	}
	buf.Write(make([]byte, 4096))
	return buf.Bytes()
}

func mustRead(t *testing.T, p, want string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil || string(b) != want {
		t.Errorf("%s: %q, %v (want %q)", p, b, err, want)
	}
}

// A tar stream that ends inside a file's content fails, naming the layer.
func TestUnpackTruncated(t *testing.T) {
	base, root := sandboxDirs(t)
	b := ti.Tar(t, ti.File("a", strings.Repeat("x", 4096), 0o644))
	_, err := oci.Unpack(context.Background(), root, layersOf(b[:1024]), oci.Limits{})
	if err == nil || !strings.Contains(err.Error(), "layerA") {
		t.Fatalf("truncated layer: %v", err)
	}
	checkOutside(t, base)
}

func FuzzUnpack(f *testing.F) {
	for _, es := range [][]ti.Entry{
		{ti.File("a", "x", 0o644), ti.Hardlink("b", "a")},
		{ti.Symlink("s", "/"), ti.File("s/x", "y", 0o644)},
		{ti.Symlink("s", "../.."), ti.Dir("s/d", 0o755), ti.File("s/d/.wh..wh..opq", "", 0)},
		{ti.Dir("d", 0o755), ti.File("d/.wh.x", "", 0), ti.Hardlink("h", "d")},
	} {
		f.Add(ti.Tar(f, es...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base, root := sandboxDirs(t)
		oci.Unpack(context.Background(), root, layersOf(data, data), oci.Limits{Bytes: 1 << 20, Entries: 1000})
		checkOutside(t, base)
	})
}
