package ns

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/guestagent/client"
	"tine/internal/nsinit"
	"tine/sandbox"
)

// TestLinkLayers: the one layer linkLayers makes of a stack shows, as the
// stacked layer of an overlay, what the stack shows: whiteouts and opaque
// directories in any layer hide what is below them, also where the upper
// layer's directory is not opaque itself, also once linked twice (a fork
// of a fork), and its files are the stack's inodes.
func TestLinkLayers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, trusted.* attributes and overlay mounts")
	}
	base := t.TempDir()
	os_, l2, l1 := filepath.Join(base, "os"), filepath.Join(base, "l2"), filepath.Join(base, "l1")
	mk := func(p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir := func(p string, opaque bool) {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if opaque {
			if err := unix.Setxattr(p, ovlOpaque, []byte("y"), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	whiteout := func(p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The OS, below everything.
	for _, p := range []string{"a", "d/x", "d/y", "gone", "h/old", "k/inos", "m/keep", "w/f", "top"} {
		mk(filepath.Join(os_, p), "os "+p)
	}
	// The lower layer of the stack.
	whiteout(filepath.Join(l2, "gone"))
	mk(filepath.Join(l2, "d/x"), "l2 x")
	whiteout(filepath.Join(l2, "h"))           // a directory deleted...
	dir(filepath.Join(l2, "k"), true)          // ...one replaced...
	mk(filepath.Join(l2, "k/in2"), "l2 in2")   //
	mk(filepath.Join(l2, "e/f"), "l2 e/f")     // ...and one made
	mk(filepath.Join(l2, "m/l2"), "l2 m")      // one merged with the OS's
	mk(filepath.Join(l2, "w"), "l2 w, a file") // a directory made a file
	whiteout(filepath.Join(l2, "top"))         // at the layer's top
	// The upper layer of the stack.
	mk(filepath.Join(l1, "h/new"), "l1 h/new") // made again, not opaque
	dir(filepath.Join(l1, "k"), false)
	mk(filepath.Join(l1, "k/in1"), "l1 in1")
	whiteout(filepath.Join(l1, "e"))
	whiteout(filepath.Join(l1, "d/y"))
	mk(filepath.Join(l1, "m/l1"), "l1 m")
	mk(filepath.Join(l1, "a"), "l1 a")
	dir(filepath.Join(l1, "w"), false)
	mk(filepath.Join(l1, "w/g"), "l1 w/g")

	// The stack is linked in two steps, as a fork of a fork stacks it:
	// l2 alone, then l1 over that.
	first, merged := filepath.Join(base, "first"), filepath.Join(base, "merged")
	if err := linkLayers(context.Background(), []string{l2}, os_, first); err != nil {
		t.Fatal(err)
	}
	if err := linkLayers(context.Background(), []string{l1, first, filepath.Join(base, "missing")}, os_, merged); err != nil {
		t.Fatal(err)
	}
	stacked := func(name, layer string) string {
		t.Helper()
		return mountStacked(t, base, name, layer, os_)
	}
	mount := func(name, lowers string) string {
		t.Helper()
		return mountLowers(t, base, name, lowers)
	}
	nlink := regexp.MustCompile(` nlink=\d+`)
	view := func(dir string) string {
		return nlink.ReplaceAllString(strings.Join(manifest(t, dir), "\n"), "")
	}
	for _, c := range []struct{ raw, linked string }{{l2, first}, {l1 + ":" + l2, merged}} {
		w, g := view(mount("raw"+filepath.Base(c.linked), c.raw+":"+os_)), view(stacked("stacked"+filepath.Base(c.linked), c.linked))
		if g != w {
			t.Fatalf("the stacked layer %s shows\n%s\nthe layers %s show\n%s", c.linked, g, c.raw, w)
		}
	}
	got := filepath.Join(base, "stackedmerged")
	for _, p := range []string{"a", "d/x", "h/new", "k/in1", "k/in2", "m/l1", "m/l2", "w/g", "m/keep"} {
		if _, err := os.Stat(filepath.Join(got, p)); err != nil {
			t.Errorf("%s missing from the view: the check above proves little", p)
		}
	}
	for _, p := range []string{"gone", "d/y", "h/old", "k/inos", "e", "w/f", "top"} {
		if _, err := os.Lstat(filepath.Join(got, p)); err == nil {
			t.Errorf("%s is seen through the stacked layer", p)
		}
	}
	var a, b unix.Stat_t
	if err := unix.Lstat(filepath.Join(l1, "a"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(merged, "a"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino {
		t.Errorf("a file of the stack was copied into the merged layer, not linked")
	}
}

// mountLowers mounts, read-only at dir/name until the test ends, an
// overlay of the layers lowers (lowerdir's form) and returns its path.
func mountLowers(t *testing.T, dir, name, lowers string) string {
	t.Helper()
	mnt := filepath.Join(dir, name)
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+lowers); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}

// mountStacked is mountLowers of the stacked layer layer over the OS tree
// base, as a sandbox's root has it (over an empty directory made in dir).
func mountStacked(t *testing.T, dir, name, layer, base string) string {
	t.Helper()
	empty := filepath.Join(dir, name+".empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	lowers, fd, err := nsinit.StackedLower(layer, empty, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	return mountLowers(t, dir, name, lowers)
}

// sameTree fails the test unless the trees want and got have the same
// manifest.
func sameTree(t *testing.T, what, want, got string) {
	t.Helper()
	if w, g := manifest(t, want), manifest(t, got); strings.Join(g, "\n") != strings.Join(w, "\n") {
		t.Errorf("%s:\n%s\nwant\n%s", what, strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
}

// TestColdStartFromSeed: a sandbox started from a seed with no warm
// instance, in a user namespace and without, stacks the seed's layer
// (its own layer starts empty): the seed's files and deletions show, a
// change to a seeded file is the sandbox's alone, and so it stays when
// the sandbox starts again over its state.
func TestColdStartFromSeed(t *testing.T) {
	for _, userns := range []bool{true, false} {
		t.Run(map[bool]string{true: "userns", false: "no-userns"}[userns], func(t *testing.T) {
			rt, dir, proj, seed := seedFixture(t, userns)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			spec := sandbox.Spec{ID: "nsseed", Hostname: "nsseed", Dir: filepath.Join(dir, "rt"),
				ProjectPath: "/srv/proj-nsseed", ProjectSource: proj, Seed: seed}
			for i, script := range []string{"echo X >> /etc/seeded", "true"} {
				in, err := rt.Start(ctx, spec)
				if err != nil {
					t.Fatal(err)
				}
				c, err := client.Dial(ctx, in.AgentSocket())
				if err != nil {
					in.Stop(ctx)
					t.Fatal(err)
				}
				out, code := run(t, c, "sh", "-c", script+"; ls /etc/os-release 2>&1 >/dev/null | wc -l; cat /etc/seeded")
				c.Close()
				if err := in.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				if code != 0 || out != "1\nSX\n" {
					t.Fatalf("start %d: exit %d: %q, want the seed's deletion and the sandbox's change", i+1, code, out)
				}
				spec.Seed = "" // started again over its state
			}
			if b, err := os.ReadFile(filepath.Join(seed, upperDir, "etc", "seeded")); err != nil || string(b) != "S" {
				t.Errorf("the seed's file after the sandbox changed its own: %q, %v", b, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "rt", lowerDir, "etc", "seeded")); err != nil {
				t.Errorf("no stacked layer: %v", err)
			}
		})
	}
}

// seedFixture returns a runtime (in a user namespace or not), a
// temporary directory dir, a project directory in it and a seed state in
// it whose own layer holds /etc/seeded ("S") and deletes /etc/os-release.
func seedFixture(t *testing.T, userns bool) (rt *Runtime, dir, proj, seed string) {
	t.Helper()
	rt, err := New(buildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	rt.UseUserns(userns)
	dir = t.TempDir()
	proj = filepath.Join(dir, "proj")
	seed = filepath.Join(dir, "seed")
	for _, d := range []string{proj, filepath.Join(seed, upperDir, "etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(seed, upperDir, "etc", "seeded"), []byte("S"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(seed, upperDir, "etc", "os-release"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	return rt, dir, proj, seed
}

// TestLinkLayersCopiesWhatCannotLink: an entry that cannot be linked
// (here: the layer is on another file system) is copied, with its
// attributes.
func TestLinkLayersCopiesWhatCannotLink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a tmpfs mount and trusted.* attributes")
	}
	base := t.TempDir()
	layer := filepath.Join(base, "layer")
	if err := os.Mkdir(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", layer, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(layer, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(layer, "f"), []byte("content"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(layer, "f"), 7, 8); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(base, "to")
	if err := linkLayers(context.Background(), []string{layer}, "", to); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(to, "f"), &st); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(to, "f"))
	if err != nil || string(b) != "content" || st.Mode&0o7777 != 0o640 || st.Uid != 7 || st.Gid != 8 {
		t.Fatalf("the copy: %q, %v, mode %o, owner %d:%d", b, err, st.Mode&0o7777, st.Uid, st.Gid)
	}
}

// TestStackSeedTooDeep: a seed whose own layer is deeper than linkLayers
// goes is copied into the sandbox's own layer instead, with its stacked
// layer still linked below.
func TestStackSeedTooDeep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	base := t.TempDir()
	seed := filepath.Join(base, "seed")
	makeLayer(t, filepath.Join(seed, upperDir), maxLayerDepth+5)
	if err := os.MkdirAll(filepath.Join(seed, lowerDir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seed, lowerDir, "etc", "inherited"), []byte("i"), 0o644); err != nil {
		t.Fatal(err)
	}
	lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := stackSeed(context.Background(), seed, "", lower, upper); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "the seed's own layer, copied", filepath.Join(seed, upperDir), upper)
	if b, err := os.ReadFile(filepath.Join(lower, "etc", "inherited")); err != nil || string(b) != "i" {
		t.Errorf("the seed's stacked layer: %q, %v", b, err)
	}
}

// TestStackable: this kernel (6.7 or later) stacks layers; the probe
// finds so.
func TestStackable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts and overlay mounts")
	}
	if err := probeStacking(); err != nil {
		t.Fatalf("stacking a layer on this kernel: %v", err)
	}
}

// TestStackSeedWithoutStacking: where the kernel cannot stack a layer,
// a seed's own layer is copied into the sandbox's, as before stacking.
func TestStackSeedWithoutStacking(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	old := stackable
	stackable = func() bool { return false }
	defer func() { stackable = old }()
	base := t.TempDir()
	seed := filepath.Join(base, "seed")
	makeLayer(t, filepath.Join(seed, upperDir), 3)
	lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := stackSeed(context.Background(), seed, "", lower, upper); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "the seed's own layer, copied", filepath.Join(seed, upperDir), upper)
	if ents, err := os.ReadDir(lower); err != nil || len(ents) != 0 {
		t.Errorf("the stacked layer of a seed that stacks none: %v, %v (want empty)", ents, err)
	}
}

// TestLinkLayersAtLinkBound: a layer file with as many names as the
// file system allows cannot be linked once more; the fork's layer gets
// one copy of it, linked under every name, not one copy a name (which a
// sandbox could turn into thousands of copies of a large file).
func TestLinkLayersAtLinkBound(t *testing.T) {
	base := t.TempDir()
	layer := filepath.Join(base, "layer")
	if err := os.MkdirAll(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(layer, "f")
	if err := os.WriteFile(f, bytes.Repeat([]byte("x"), 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	names := linkToBound(t, f, filepath.Join(layer, "d"))
	to := filepath.Join(base, "to")
	if err := linkLayers(context.Background(), []string{layer}, "", to); err != nil {
		t.Fatal(err)
	}
	inodes := map[uint64]bool{}
	for _, n := range append(names, f) {
		p := filepath.Join(to, strings.TrimPrefix(n, layer))
		inodes[inode(t, p)] = true
	}
	if len(inodes) > 2 {
		t.Fatalf("%d names of one file at the link bound became %d files", len(names)+1, len(inodes))
	}
	if b, err := os.ReadFile(filepath.Join(to, "d", "0")); err != nil || len(b) != 8192 {
		t.Fatalf("a name of the copy: %d bytes, %v", len(b), err)
	}
}
