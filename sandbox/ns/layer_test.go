package ns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// manifest describes every entry under dir: type, mode, owner, size,
// mtime, device number, link count, symlink target, content and
// extended attributes.
func manifest(t *testing.T, dir string) []string {
	t.Helper()
	return walkManifest(t, dir, false)
}

// manifestFound is manifest leaving out the names a directory lists that
// are then not found (an overlay's whiteout in a directory the layers
// below do not have).
func manifestFound(t *testing.T, dir string) []string {
	t.Helper()
	return walkManifest(t, dir, true)
}

func walkManifest(t *testing.T, dir string, found bool) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if found && errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := fmt.Sprintf("%s mode=%o uid=%d gid=%d rdev=%d nlink=%d mtime=%d", rel, st.Mode, st.Uid, st.Gid, st.Rdev, st.Nlink, st.Mtim.Nano())
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" size=%d data=%q", st.Size, b)
		case unix.S_IFLNK:
			tgt, _ := os.Readlink(p)
			line += " -> " + tgt
		}
		sz, _ := unix.Llistxattr(p, nil)
		if sz > 0 {
			buf := make([]byte, sz)
			sz, _ = unix.Llistxattr(p, buf)
			names := strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00")
			sort.Strings(names)
			for _, n := range names {
				if n == "" {
					continue // every name hidden (overlayfs's own)
				}
				v := make([]byte, 256)
				k, _ := unix.Lgetxattr(p, n, v)
				line += fmt.Sprintf(" %s=%q", n, v[:max(k, 0)])
			}
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// makeLayer fills dir with what an overlay upper layer holds.
func makeLayer(t *testing.T, dir string, deep int) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc", "opaque"), 0o755))
	must(unix.Setxattr(filepath.Join(dir, "etc", "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644))
	must(unix.Setxattr(filepath.Join(dir, "etc", "passwd"), "user.note", []byte("kept"), 0))
	must(unix.Mknod(filepath.Join(dir, "etc", "gone"), unix.S_IFCHR|0o000, 0)) // a whiteout
	must(unix.Mkfifo(filepath.Join(dir, "etc", "fifo"), 0o640))
	must(os.WriteFile(filepath.Join(dir, "etc", "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chown(filepath.Join(dir, "etc", "suid"), 1000, 1000))
	must(os.Chmod(filepath.Join(dir, "etc", "suid"), 0o4755))
	must(os.Link(filepath.Join(dir, "etc", "passwd"), filepath.Join(dir, "etc", "passwd-link")))
	must(os.Symlink("../etc/passwd", filepath.Join(dir, "etc", "sym")))
	must(os.Symlink("/", filepath.Join(dir, "root-link")))
	must(os.WriteFile(filepath.Join(dir, "blob"), make([]byte, 300<<10), 0o600))
	must(os.Chown(filepath.Join(dir, "etc"), 12, 34))
	p := dir
	for i := 0; i < deep; i++ {
		p = filepath.Join(p, "d")
	}
	must(os.MkdirAll(p, 0o755))
	must(os.WriteFile(filepath.Join(p, "bottom"), []byte("b"), 0o644))
	// Times last: every write above changed some.
	must(filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		ts := []unix.Timespec{{Sec: 1000, Nsec: 5}, {Sec: 2000, Nsec: 7}}
		return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	}))
}

// TestCopyLayer: the in-process copy of a layer is what cp -a makes, for
// a shallow layer (copied in process) and for one deeper than it goes
// (copied by cp -a after the first try).
func TestCopyLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	for _, deep := range []int{3, maxLayerDepth + 5} {
		t.Run(fmt.Sprint(deep), func(t *testing.T) {
			base := t.TempDir()
			src := filepath.Join(base, "src")
			makeLayer(t, src, deep)
			ref := filepath.Join(base, "ref")
			if out, err := exec.Command("cp", "-a", src, ref).CombinedOutput(); err != nil {
				t.Fatalf("cp -a: %v: %s", err, out)
			}
			dst := filepath.Join(base, "dst")
			if err := copyLayer(context.Background(), src, dst); err != nil {
				t.Fatal(err)
			}
			want, got := manifest(t, ref), manifest(t, dst)
			if len(want) < 10+deep {
				t.Fatalf("the reference copy has %d entries: the check below proves little", len(want))
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				for i := range max(len(got), len(want)) {
					var g, w string
					if i < len(got) {
						g = got[i]
					}
					if i < len(want) {
						w = want[i]
					}
					if g != w {
						t.Errorf("entry %d:\n got %s\nwant %s", i, g, w)
					}
				}
			}
		})
	}
}

// TestCopyStateAtomic: CopyState puts a whole copy at its destination or
// nothing: a copy cut short (its context cancelled) leaves neither the
// destination nor its temporary directory, and a temporary directory
// that a crash left is replaced.
func TestCopyStateAtomic(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	base := t.TempDir()
	from := filepath.Join(base, "from")
	makeLayer(t, filepath.Join(from, upperDir), 3)
	var r Runtime
	to := filepath.Join(base, "to")
	tmp := filepath.Join(base, ".tmp-to")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.CopyState(ctx, from, to); err == nil {
		t.Fatal("a cancelled copy succeeded")
	}
	for _, p := range []string{to, tmp} {
		if _, err := os.Lstat(p); err == nil {
			t.Fatalf("%s left by a copy cut short", p)
		}
	}
	if err := os.MkdirAll(filepath.Join(tmp, upperDir, "stale"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.CopyState(context.Background(), from, to); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(tmp); err == nil {
		t.Fatalf("%s left after the copy", tmp)
	}
	want, got := manifest(t, filepath.Join(from, upperDir)), manifest(t, filepath.Join(to, upperDir))
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("copy differs from its source:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
