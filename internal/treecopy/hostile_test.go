package treecopy

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// rootName returns a name in / that no test run shares, removed after
// the test if something made it.
func rootName(t *testing.T) string {
	var b [8]byte
	rand.Read(b[:])
	p := "/treecopy-test-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s was made outside the target", p)
			os.RemoveAll(p)
		}
	})
	return p
}

func TestHostileArchives(t *testing.T) {
	type hostile struct {
		name     string
		ents     func(s *sandbox, abs string) []ent
		opts     Options
		wantErr  string                                   // a part of the error; "" for none
		mergeErr string                                   // wantErr when merging, if another
		check    func(t *testing.T, top string, st Stats) // after success
	}
	top := dirEnt("top/", 0o755)
	cases := []hostile{
		{name: "dotdot first", wantErr: `".."`, ents: func(s *sandbox, abs string) []ent {
			return []ent{fileEnt("../x", "x", 0o644)}
		}},
		{name: "dotdot", wantErr: `entry "../x"`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("../x", "x", 0o644)}
		}},
		{name: "dotdot inside", wantErr: `entry "top/../../x"`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("top/../../x", "x", 0o644)}
		}},
		{name: "dotdot that cleans inside", wantErr: `".."`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("top/a/../b", "x", 0o644)}
		}},
		{name: "absolute first", wantErr: "absolute", ents: func(s *sandbox, abs string) []ent {
			return []ent{fileEnt(abs, "x", 0o644)}
		}},
		{name: "absolute", wantErr: "absolute", ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt(abs, "x", 0o644), fileEnt(filepath.Join(s.base, "x"), "x", 0o644)}
		}},
		{name: "second top", wantErr: `entry "other/x": it is not under the top "top"`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("top/a", "a", 0o644), fileEnt("other/x", "x", 0o644)}
		}},
		{name: "prefix of top", wantErr: `not under the top`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("topx", "x", 0o644)}
		}},
		{name: "first entry below the top", wantErr: "the first entry must name the top", ents: func(s *sandbox, abs string) []ent {
			return []ent{fileEnt("top/x", "x", 0o644)}
		}},
		{name: "dot", wantErr: "names no file", ents: func(s *sandbox, abs string) []ent {
			return []ent{dirEnt("./", 0o755), fileEnt("./x", "x", 0o644)}
		}},
		{name: "after a top file", wantErr: "may hold nothing else", mergeErr: "it is a directory and the archive holds a regular file", ents: func(s *sandbox, abs string) []ent {
			return []ent{fileEnt("top", "x", 0o644), fileEnt("top/x", "x", 0o644)}
		}},
		{name: "after a top symlink", wantErr: "may hold nothing else", mergeErr: "it is a directory and the archive holds a symlink", ents: func(s *sandbox, abs string) []ent {
			return []ent{linkEnt("top", "/"), fileEnt("top"+abs, "x", 0o644)}
		}},
		{name: "symlink to root", wantErr: `"l" is a symlink`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, linkEnt("top/l", "/"), fileEnt("top/l"+abs, "x", 0o644)}
		}},
		{name: "symlink to the sentinel", wantErr: `"l" is a symlink`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, linkEnt("top/l", s.sentinel), fileEnt("top/l/x", "x", 0o644)}
		}},
		{name: "symlink up", wantErr: `"l" is a symlink`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, linkEnt("top/l", ".."), fileEnt("top/l/x", "x", 0o644)}
		}},
		{name: "symlink up, deeper", wantErr: `"a/l" is a symlink`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, dirEnt("top/a/", 0o755), linkEnt("top/a/l", "../../../sentinel"), fileEnt("top/a/l/sub/x", "x", 0o644)}
		}},
		{name: "directory through a symlink", wantErr: `"l" is a symlink, not a directory`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, linkEnt("top/l", ".."), dirEnt("top/l/", 0o755), fileEnt("top/l/x", "x", 0o644)}
		}},
		{name: "symlink over the top", wantErr: "replace the top directory", ents: func(s *sandbox, abs string) []ent {
			return []ent{top, linkEnt("top", "/")}
		}},
		{name: "file over a directory", wantErr: `"d" is a directory`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, dirEnt("top/d/", 0o755), fileEnt("top/d", "x", 0o644)}
		}},
		{name: "symlink over a directory", wantErr: `"d" is a directory`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, dirEnt("top/d/", 0o755), fileEnt("top/d/x", "x", 0o644), linkEnt("top/d", "/")}
		}},
		{name: "directory over a file", wantErr: `"f" is a regular file, not a directory`, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("top/f", "x", 0o644), dirEnt("top/f/", 0o755)}
		}},
		{name: "empty symlink", wantErr: "symlink target", ents: func(s *sandbox, abs string) []ent {
			return []ent{top, linkEnt("top/l", "")}
		}},
		{name: "hard link", ents: func(s *sandbox, abs string) []ent {
			return []ent{top,
				{h: tar.Header{Typeflag: tar.TypeLink, Name: "top/pw", Linkname: "/etc/passwd"}},
				{h: tar.Header{Typeflag: tar.TypeLink, Name: "top/s", Linkname: filepath.Join(s.sentinel, "keep")}},
				fileEnt("top/f", "f", 0o644),
				{h: tar.Header{Typeflag: tar.TypeLink, Name: "top/f2", Linkname: "top/f"}},
			}
		}, check: func(t *testing.T, top string, st Stats) {
			if got := entries(t, top); !slices.Equal(got, []string{"f"}) {
				t.Errorf("top holds %q, want only f", got)
			}
			if st.Skipped != 3 {
				t.Errorf("skipped %d, want 3", st.Skipped)
			}
		}},
		{name: "devices and fifo", ents: func(s *sandbox, abs string) []ent {
			return []ent{top,
				{h: tar.Header{Typeflag: tar.TypeChar, Name: "top/null", Devmajor: 1, Devminor: 3}},
				{h: tar.Header{Typeflag: tar.TypeBlock, Name: "top/sda", Devmajor: 8, Devminor: 0}},
				{h: tar.Header{Typeflag: tar.TypeFifo, Name: "top/fifo"}},
				{h: tar.Header{Typeflag: 'Z', Name: "top/unknown"}},
			}
		}, check: func(t *testing.T, top string, st Stats) {
			if got := entries(t, top); len(got) != 0 {
				t.Errorf("top holds %q, want nothing", got)
			}
			if st.Skipped != 4 {
				t.Errorf("skipped %d, want 4", st.Skipped)
			}
		}},
		{name: "setuid dropped", ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("top/suid", "x", 0o4755), fileEnt("top/sgid", "x", 0o2755), dirEnt("top/sticky/", 0o3777)}
		}, check: func(t *testing.T, top string, st Stats) {
			checkModes(t, top, map[string]uint32{"suid": 0o755, "sgid": 0o755, "sticky": 0o777})
		}},
		{name: "setuid kept", opts: Options{KeepSpecial: true}, ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("top/suid", "x", 0o4755), fileEnt("top/sgid", "x", 0o2755), dirEnt("top/sticky/", 0o3777)}
		}, check: func(t *testing.T, top string, st Stats) {
			checkModes(t, top, map[string]uint32{"suid": 0o4755, "sgid": 0o2755, "sticky": 0o3777})
		}},
		{name: "read-only directory filled", ents: func(s *sandbox, abs string) []ent {
			return []ent{top, dirEnt("top/ro/", 0o500), fileEnt("top/ro/f", "f", 0o400), dirEnt("top/ro/sub/", 0o500), fileEnt("top/ro/sub/g", "g", 0o400), dirEnt("top/none/", 0o000)}
		}, check: func(t *testing.T, top string, st Stats) {
			checkModes(t, top, map[string]uint32{"ro": 0o500, "ro/f": 0o400, "ro/sub": 0o500, "ro/sub/g": 0o400, "none": 0})
			for _, d := range []string{"ro/sub", "ro", "none"} {
				os.Chmod(filepath.Join(top, d), 0o700) // for the clean-up when not root
			}
		}},
		{name: "duplicates", ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("top/f", "one", 0o644), dirEnt("top/d/", 0o700), fileEnt("top/f", "two", 0o600), dirEnt("top/d/", 0o750), linkEnt("top/l", "a"), linkEnt("top/l", "b")}
		}, check: func(t *testing.T, top string, st Stats) {
			got := snapshot(t, top)
			if got["f"].Content != "two" || got["f"].Mode != 0o600 || got["d"].Mode != 0o750 || got["l"].Link != "b" || len(got) != 4 {
				t.Errorf("after duplicates: %+v", got)
			}
		}},
		{name: "missing parents", ents: func(s *sandbox, abs string) []ent {
			return []ent{top, fileEnt("top/a/b/f", "f", 0o644)}
		}, check: func(t *testing.T, top string, st Stats) {
			checkModes(t, top, map[string]uint32{"a": 0o755, "a/b": 0o755, "a/b/f": 0o644})
		}},
	}
	for _, c := range cases {
		for _, merge := range []bool{false, true} {
			name := c.name
			if merge {
				name += " merged"
			}
			t.Run(name, func(t *testing.T) {
				s := newSandbox(t)
				abs := rootName(t)
				target := filepath.Join(s.parent, "top")
				if merge {
					os.Mkdir(target, 0o755)
				}
				st, err := extractTo(t, makeTar(t, c.ents(s, abs)...), s.parent, "", c.opts)
				wantErr := c.wantErr
				if merge && c.mergeErr != "" {
					wantErr = c.mergeErr
				}
				switch {
				case wantErr == "" && err != nil:
					t.Fatalf("error: %v", err)
				case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
					t.Errorf("error %v, want one with %q", err, wantErr)
				}
				s.checkOutside(t)
				if temps := listTemps(t, s.parent); temps != nil {
					t.Errorf("temporaries left: %q", temps)
				}
				if err != nil && !merge {
					if got := entries(t, s.parent); len(got) != 0 {
						t.Errorf("after the error, parent holds %q", got)
					}
				}
				if err != nil && merge {
					if got := entries(t, s.parent); !slices.Equal(got, []string{"top"}) {
						t.Errorf("after the error, parent holds %q", got)
					}
				}
				if err == nil && c.check != nil {
					c.check(t, target, st)
				}
				checkNoSpecial(t, s.parent, c.opts.KeepSpecial)
			})
		}
	}
}

// checkModes fails t unless the files under dir have the modes given.
func checkModes(t *testing.T, dir string, want map[string]uint32) {
	t.Helper()
	for name, mode := range want {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, name), &st); err != nil {
			t.Error(err)
			continue
		}
		if st.Mode&0o7777 != mode {
			t.Errorf("%s: mode %#o, want %#o", name, st.Mode&0o7777, mode)
		}
	}
}

// checkNoSpecial fails t if anything under root is a device, fifo or
// socket, or (unless special) has a setuid or setgid bit.
func checkNoSpecial(t testing.TB, root string, special bool) {
	t.Helper()
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Errorf("walk %s: %v", p, err)
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Error(err)
			return nil
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR, unix.S_IFREG, unix.S_IFLNK:
		default:
			t.Errorf("%s: made a %s", p, kindOf(st.Mode))
		}
		if !special && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			t.Errorf("%s: mode %#o has setuid or setgid", p, st.Mode&0o7777)
		}
		return nil
	})
}

func TestMergeThroughSymlink(t *testing.T) {
	outside := t.TempDir()
	for _, ents := range [][]ent{
		{dirEnt("top/", 0o755), fileEnt("top/sub/x", "x", 0o644)},
		{dirEnt("top/", 0o755), dirEnt("top/sub/", 0o755), fileEnt("top/sub/x", "x", 0o644)},
		{dirEnt("top/", 0o755), fileEnt("top/sub/deeper/x", "x", 0o644)},
		{dirEnt("top/", 0o755), linkEnt("top/sub/x", "/")},
	} {
		s := newSandbox(t)
		target := filepath.Join(s.parent, "top")
		os.Mkdir(target, 0o755)
		if err := os.Symlink(outside, filepath.Join(target, "sub")); err != nil {
			t.Fatal(err)
		}
		_, err := extractTo(t, makeTar(t, ents...), s.parent, "", Options{})
		if err == nil || !strings.Contains(err.Error(), `"sub" is a symlink`) {
			t.Errorf("%s: %v, want an error naming the symlink", ents[1].h.Name, err)
		}
		if got := entries(t, outside); len(got) != 0 {
			t.Fatalf("%s: wrote %q outside", ents[1].h.Name, got)
		}
		if l, err := os.Readlink(filepath.Join(target, "sub")); err != nil || l != outside {
			t.Errorf("the symlink changed: %q %v", l, err)
		}
		s.checkOutside(t)
	}
	// A target that is a symlink to a directory is not merged into.
	s := newSandbox(t)
	os.Symlink(outside, filepath.Join(s.parent, "top"))
	_, err := extractTo(t, makeTar(t, dirEnt("top/", 0o755), fileEnt("top/x", "x", 0o644)), s.parent, "", Options{})
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("into a symlink target: %v", err)
	}
	if got := entries(t, outside); len(got) != 0 {
		t.Fatalf("wrote %q outside", got)
	}
}

func TestTooManyDirs(t *testing.T) {
	old := maxDirs
	maxDirs = 10
	defer func() { maxDirs = old }()
	ents := []ent{dirEnt("top/", 0o755)}
	for i := range 11 {
		ents = append(ents, dirEnt("top/d"+strings.Repeat("x", i)+"/", 0o755))
	}
	dst := t.TempDir()
	if _, err := extractTo(t, makeTar(t, ents...), dst, "", Options{}); err == nil || !strings.Contains(err.Error(), "more than 10 directories") {
		t.Errorf("11 directories with a limit of 10: %v", err)
	}
	if got := entries(t, dst); len(got) != 0 {
		t.Errorf("parent holds %q", got)
	}
	if _, err := extractTo(t, makeTar(t, ents[:11]...), dst, "", Options{}); err != nil {
		t.Errorf("10 directories with a limit of 10: %v", err)
	}
}

func TestCleanName(t *testing.T) {
	for name, want := range map[string]string{
		"a": "a", "a/": "a", "a//b/": "a/b", "./a/./b": "a/b", "a/b//": "a/b",
		"": "", ".": "", "./": "", "/a": "", "..": "", "a/../b": "", "a/..": "", "a\x00b": "", "//a": "",
	} {
		got, err := cleanName(name)
		if (err == nil) != (want != "") || got != want {
			t.Errorf("cleanName(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
}

func TestResolveReopen(t *testing.T) {
	dir := t.TempDir()
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := fdCount(t)
	var st Stats
	x := &extractor{root: root, st: &st, index: map[dirKey]int32{}}
	defer x.closePath()
	comps := strings.Split(strings.TrimSuffix(strings.Repeat("d/", 3*maxOpen), "/"), "/")
	if _, _, err := x.resolve(comps, true); err != nil {
		t.Fatal(err)
	}
	if x.open != maxOpen || fdCount(t) != before+maxOpen {
		t.Errorf("%d descriptors open (%d counted), want %d", fdCount(t)-before, x.open, maxOpen)
	}
	// Levels closed to bound the descriptors are opened again from the
	// nearest open one above, checked against what was there.
	for i := range x.path {
		if x.path[i].fd >= 0 {
			unix.Close(x.path[i].fd)
			x.path[i].fd = -1
			x.open--
		}
	}
	fd, idx, err := x.fdOf(maxOpen)
	if err != nil || idx != int32(maxOpen-1) {
		t.Fatalf("fdOf: %d, %v", idx, err)
	}
	var a, b unix.Stat_t
	unix.Fstat(fd, &a)
	unix.Stat(filepath.Join(dir, strings.Join(comps[:maxOpen], "/")), &b)
	if a.Ino != b.Ino {
		t.Error("fdOf opened another directory")
	}
	// A directory swapped for another is found out when opened again.
	p := filepath.Join(dir, strings.Join(comps[:10], "/"))
	if err := os.Rename(p, p+".old"); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(p, strings.Join(comps[:20], "/")), 0o700)
	for i := 9; i < len(x.path); i++ {
		if x.path[i].fd >= 0 {
			unix.Close(x.path[i].fd)
			x.path[i].fd = -1
			x.open--
		}
	}
	if _, _, err := x.fdOf(20); err == nil || !strings.Contains(err.Error(), "moved") {
		t.Errorf("fdOf through a swapped directory: %v", err)
	}
	x.closePath() // root too
	if got := fdCount(t); got != before-1 {
		t.Errorf("%d descriptors left open", got-before+1)
	}
}
