package treecopy

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// makeWritable gives every directory under root its owner's full access,
// so that the test's clean-up can remove it when not root.
func makeWritable(root string) {
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			os.Chmod(p, 0o700) // before WalkDir reads it
		}
		return nil
	})
}

// fixChecksums returns data with the checksum of each tar header it can
// find set right, so that the fuzzer's mutations of header fields reach
// Extract rather than stop at archive/tar's checksum test. A valid
// stream is returned as it is.
func fixChecksums(data []byte) []byte {
	data = bytes.Clone(data)
	for off := 0; off+512 <= len(data); {
		b := data[off : off+512]
		off += 512
		if bytes.Equal(b, make([]byte, 512)) {
			continue
		}
		copy(b[148:156], "        ")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
		switch b[156] {
		case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
			continue // no data
		}
		size, err := strconv.ParseInt(strings.Trim(string(b[124:136]), " \x00"), 8, 64)
		if err != nil || size < 0 || size > int64(len(data)) {
			return data
		}
		off += int(size+511) &^ 511
	}
	return data
}

func FuzzExtract(f *testing.F) {
	src := f.TempDir()
	top := filepath.Join(src, "top")
	os.MkdirAll(filepath.Join(top, "a", "b"), 0o755)
	writeFile(f, filepath.Join(top, "a", "f"), "content", 0o640)
	writeFile(f, filepath.Join(top, "zeros"), strings.Repeat("\x00", 10000)+"x", 0o644)
	os.Symlink("../f", filepath.Join(top, "a", "b", "l"))
	writeFile(f, filepath.Join(src, "file"), "file", 0o755)
	for _, name := range []string{"top", "file"} {
		data, _ := archiveDir(f, src, name)
		f.Add(data)
	}
	d := dirEnt("top/", 0o755)
	for _, ents := range [][]ent{
		{d, fileEnt("../x", "x", 0o644)},
		{d, fileEnt("/abs", "x", 0o644)},
		{d, fileEnt("top/../../x", "x", 0o644)},
		{d, fileEnt("other/x", "x", 0o644)},
		{d, linkEnt("top/l", "/"), fileEnt("top/l/etc-x", "x", 0o644)},
		{d, linkEnt("top/l", ".."), fileEnt("top/l/x", "x", 0o644)},
		{d, {h: tar.Header{Typeflag: tar.TypeLink, Name: "top/pw", Linkname: "/etc/passwd"}}},
		{d, {h: tar.Header{Typeflag: tar.TypeChar, Name: "top/null", Devmajor: 1, Devminor: 3}}},
		{d, fileEnt("top/suid", "x", 0o4755)},
		{d, dirEnt("top/ro/", 0o500), fileEnt("top/ro/f", "f", 0o644)},
		{d, dirEnt("top/d/", 0o755), fileEnt("top/d", "x", 0o644)},
		{fileEnt("top", "x", 0o644), fileEnt("top/x", "x", 0o644)},
	} {
		f.Add(makeTar(f, ents...))
	}
	// One sandbox for all inputs, its parent made afresh for each: a
	// file system slows down under many short-lived directories.
	s := newSentinel(f, f.TempDir())
	rootBefore := entries(f, "/")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.Mkdir(s.parent, 0o755); err != nil {
			t.Fatal(err)
		}
		defer func() {
			makeWritable(s.parent)
			if err := os.RemoveAll(s.parent); err != nil {
				t.Fatal(err)
			}
		}()
		_, err := extractTo(t, fixChecksums(data), s.parent, "t", Options{})
		s.checkOutside(t)
		if after := entries(t, "/"); !slices.Equal(after, rootBefore) {
			t.Errorf("/ changed: %q, was %q", after, rootBefore)
		}
		checkNoSpecial(t, s.parent, false)
		names := entries(t, s.parent)
		if err != nil && len(names) != 0 {
			t.Errorf("error %v, yet parent holds %q", err, names)
		}
		if err == nil && !slices.Equal(names, []string{"t"}) {
			t.Errorf("parent holds %q, want [t]", names)
		}
		if temps := listTemps(t, s.parent); temps != nil {
			t.Errorf("temporaries left: %q", temps)
		}
	})
}

func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte("\x00a\x01b\x02b/c\x03l"), []byte("hello"))
	f.Add([]byte("\x01d/e/f\x00d/e/f/g\x02new\nline\x00bad\xff"), []byte("\x00\x00\x00x"))
	f.Add([]byte("\x02"+strings.Repeat("n", 255)+"\x00"+strings.Repeat("m", 256)), []byte("/abs/target"))
	f.Add([]byte("\x81x\x46y\x07z"), []byte(""))
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, spec, content []byte) {
		src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
		for _, d := range []string{src, dst} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			defer func() {
				makeWritable(d)
				if err := os.RemoveAll(d); err != nil {
					t.Fatal(err)
				}
			}()
		}
		root := filepath.Join(src, "top")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		// spec is items split by bytes under 8: the byte says what to
		// make (and with what mode), the rest names it; a slash nests.
		var items [][]byte
		for len(spec) > 0 && len(items) < 16 {
			kind := spec[0]
			spec = spec[1:]
			i := slices.IndexFunc(spec, func(b byte) bool { return b < 8 })
			if i < 0 {
				i = len(spec)
			}
			items = append(items, append([]byte{kind}, spec[:i]...))
			spec = spec[i:]
		}
		for n, it := range items {
			kind, name := it[0], string(it[1:])
			if name == "" || strings.HasPrefix(name, "/") || slices.ContainsFunc(strings.Split(name, "/"), func(c string) bool { return c == "" || c == "." || c == ".." }) {
				continue
			}
			// Make the directories on the way, through no symlink: a
			// symlink the input made may point anywhere.
			comps := strings.Split(name, "/")
			dir, ok := root, true
			for _, c := range comps[:len(comps)-1] {
				dir = filepath.Join(dir, c)
				err := os.Mkdir(dir, 0o755)
				if fi, lerr := os.Lstat(dir); err != nil && (lerr != nil || !fi.IsDir()) {
					ok = false
					break
				}
			}
			if !ok {
				continue
			}
			p := filepath.Join(dir, comps[len(comps)-1])
			mode := os.FileMode(0o644)
			if len(content) > n {
				mode = os.FileMode(content[n]) & 0o777
			}
			var err error
			switch kind % 4 {
			case 0, 3:
				var fh *os.File
				// O_EXCL: never through a symlink.
				if fh, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
					_, err = fh.Write(content[min(n, len(content)):])
					fh.Close()
					if err == nil {
						err = os.Chmod(p, mode|0o400)
					}
				}
			case 1:
				if err = os.Mkdir(p, 0o700); err == nil {
					err = os.Chmod(p, mode|0o700)
				}
			case 2:
				target := string(content)
				if target == "" || strings.IndexByte(target, 0) >= 0 {
					target = "target"
				}
				err = os.Symlink(target, p)
			}
			if err != nil && !errors.Is(err, os.ErrExist) && !errors.Is(err, unix.ENAMETOOLONG) {
				t.Fatalf("make %q: %v", name, err)
			}
		}
		data, ast := archiveDir(t, src, "top")
		est, err := extractTo(t, data, dst, "", Options{})
		if err != nil {
			t.Fatalf("extract: %v", err)
		}
		if ast != est {
			t.Errorf("stats: Archive %+v, Extract %+v", ast, est)
		}
		compareTrees(t, root, filepath.Join(dst, "top"))
		var st bytes.Buffer
		if _, err := Archive(context.Background(), &st, openDirFD(t, dst), "top"); err != nil || !bytes.Equal(st.Bytes(), data) {
			t.Errorf("archiving the copy gives another archive: %v", err)
		}
	})
}
