package ns

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"tine/internal/fuzzbytes"
)

// FuzzLinkLayers: for two upper layers a sandbox could have written (any
// mix of files, directories, symlinks, whiteouts and opaque directories
// over an OS tree), what linkLayers makes of them, in two steps as a
// fork of a fork does, shows as a stacked layer exactly what the two
// layers show stacked.
func FuzzLinkLayers(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("needs root: whiteouts, trusted.* attributes and overlay mounts")
	}
	f.Add([]byte{1, 0, 0, 0, 1, 1, 3, 0, 2, 9, 2, 0, 1, 0, 3, 4, 1, 2, 3})
	f.Add([]byte{1, 3, 1, 5, 0, 9, 2, 0, 4, 1, 8, 1, 1, 1, 3, 3, 2, 7, 0, 6})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 256 {
			return
		}
		r := fuzzbytes.New(b)
		base := t.TempDir()
		layers := map[string]string{}
		for _, n := range []string{"os", "l2", "l1"} {
			layers[n] = filepath.Join(base, n)
			if err := os.Mkdir(layers[n], 0o755); err != nil {
				t.Fatal(err)
			}
			for ops := int(r.Byte() % 8); ops > 0 && r.Len() > 0; ops-- {
				fuzzEntry(t, layers[n], r, n != "os")
			}
		}
		first, merged := filepath.Join(base, "first"), filepath.Join(base, "merged")
		if err := linkLayers(context.Background(), []string{layers["l2"]}, layers["os"], first); err != nil {
			t.Fatal(err)
		}
		if err := linkLayers(context.Background(), []string{layers["l1"], first}, layers["os"], merged); err != nil {
			t.Fatal(err)
		}
		got := mountStacked(t, base, "stacked", merged, layers["os"])
		want := mountLowers(t, base, "raw", layers["l1"]+":"+layers["l2"]+":"+layers["os"])
		nlink := regexp.MustCompile(` nlink=\d+`)
		// The stacked view lists only what it finds (manifest fails on a
		// listed name that is not found); the layers themselves may list
		// a whiteout in a directory the OS does not have, which is then
		// not found, and those are left out of their view.
		g := nlink.ReplaceAllString(strings.Join(manifest(t, got), "\n"), "")
		if w := nlink.ReplaceAllString(strings.Join(manifestFound(t, want), "\n"), ""); g != w {
			t.Fatalf("the stacked layer shows\n%s\nthe layers show\n%s", g, w)
		}
	})
}

// fuzzEntry adds to the layer dir one entry that r chooses: a file, a
// directory, a symlink or, in an upper layer, a whiteout or an opaque
// directory, at one of a few paths (parents made as directories where
// they can be).
func fuzzEntry(t *testing.T, dir string, r *fuzzbytes.Reader, upper bool) {
	names := []string{"a", "b", "c"}
	var parts []string
	for depth := 1 + int(r.Byte()%3); depth > 0; depth-- {
		parts = append(parts, names[int(r.Byte())%len(names)])
	}
	p := filepath.Join(append([]string{dir}, parts...)...)
	if os.MkdirAll(filepath.Dir(p), 0o755) != nil {
		return // a parent is a file
	}
	if _, err := os.Lstat(p); err == nil {
		return
	}
	var err error
	switch op := r.Byte() % 5; {
	case op == 0:
		err = os.WriteFile(p, []byte(p), 0o644)
	case op == 1:
		err = os.Mkdir(p, 0o755)
	case op == 2:
		err = os.Symlink("../"+names[int(r.Byte())%len(names)], p)
	case op == 3 && upper:
		err = unix.Mknod(p, unix.S_IFCHR, 0)
	case op == 4 && upper:
		if err = os.Mkdir(p, 0o755); err == nil {
			err = unix.Setxattr(p, ovlOpaque, []byte("y"), 0)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}
