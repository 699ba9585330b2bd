package fuseserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// mounted is a Server of a temporary directory mounted by the kernel.
type mounted struct {
	dir, mnt string
	srv      *Server
	dev      uint32 // the connection's number under /sys/fs/fuse/connections
}

// mount serves a temporary directory on a temporary mountpoint until the
// test ends. A mount that fails fails the test.
func mount(t *testing.T, opts fuse.MountOptions) *mounted {
	t.Helper()
	m := &mounted{dir: t.TempDir(), mnt: t.TempDir()}
	s := newServer(t, m.dir)
	m.srv = s
	opts.DirectMount = true
	opts.FsName = "fuseserver-test"
	opts.Name = "fuseserver"
	srv, err := fuse.NewServer(s, m.mnt, &opts)
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		t.Fatalf("wait for mount: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(m.mnt, &st); err != nil {
		t.Fatalf("stat of the mount: %v", err)
	}
	m.dev = unix.Minor(st.Dev)
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			if out, err := exec.Command("umount", "-l", m.mnt).CombinedOutput(); err != nil {
				t.Errorf("umount -l: %v: %s", err, out)
			}
		}
	})
	return m
}

// within runs f, failing the test if it takes over a minute; then the
// connection is aborted so the blocked calls return and the binary can exit.
func (m *mounted) within(t *testing.T, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		abort := fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", m.dev)
		if err := os.WriteFile(abort, []byte("1"), 0o200); err != nil {
			t.Errorf("abort the connection: %v", err)
		}
		t.Fatal("file operations on the mount hang")
	}
}

func expect(what string, got, want any) error {
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("%s: got %v, want %v", what, got, want)
	}
	return nil
}

func TestMountFiles(t *testing.T) {
	m := mount(t, fuse.MountOptions{})
	p := func(name string) string { return filepath.Join(m.mnt, name) }
	m.within(t, func() error {
		// Create, write, read, append.
		if err := os.WriteFile(p("a"), []byte("hello"), 0o640); err != nil {
			return err
		}
		f, err := os.OpenFile(p("a"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString(" world")
		f.Close()
		if err != nil {
			return err
		}
		if b, err := os.ReadFile(p("a")); err != nil || string(b) != "hello world" {
			return fmt.Errorf("read after append: %q %v", b, err)
		}
		if b, err := os.ReadFile(filepath.Join(m.dir, "a")); err != nil || string(b) != "hello world" {
			return fmt.Errorf("backing file: %q %v", b, err)
		}
		fi, err := os.Stat(p("a"))
		if err != nil {
			return err
		}
		if err := expect("mode of a new file", fi.Mode().Perm(), os.FileMode(0o640)); err != nil {
			return err
		}

		// Directories and renames.
		if err := os.MkdirAll(p("d/e"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p("d/e/f"), []byte("deep"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(p("a"), p("d/a2")); err != nil {
			return err
		}
		if err := os.Rename(p("d"), p("D")); err != nil {
			return err
		}
		if b, err := os.ReadFile(p("D/e/f")); err != nil || string(b) != "deep" {
			return fmt.Errorf("file under renamed dir: %q %v", b, err)
		}
		if err := os.WriteFile(p("D/e/f"), []byte("deeper"), 0o644); err != nil {
			return err
		}
		if b, err := os.ReadFile(filepath.Join(m.dir, "D/e/f")); err != nil || string(b) != "deeper" {
			return fmt.Errorf("backing file under renamed dir: %q %v", b, err)
		}
		if _, err := os.Stat(p("d")); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("old dir name: %v", err)
		}
		if err := os.Mkdir(p("empty"), 0o700); err != nil {
			return err
		}
		if err := os.Remove(p("empty")); err != nil {
			return err
		}
		if err := os.Remove(p("D")); err == nil {
			return errors.New("rmdir of a non-empty dir succeeded")
		}

		// Hard link and symlink.
		if err := os.Link(p("D/a2"), p("hard")); err != nil {
			return err
		}
		if fi, err := os.Stat(p("hard")); err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 2 {
			return fmt.Errorf("hard link: %v %v", fi, err)
		}
		if b, err := os.ReadFile(p("hard")); err != nil || string(b) != "hello world" {
			return fmt.Errorf("read of hard link: %q %v", b, err)
		}
		if err := os.Symlink("D/a2", p("sym")); err != nil {
			return err
		}
		if to, err := os.Readlink(p("sym")); err != nil || to != "D/a2" {
			return fmt.Errorf("readlink: %q %v", to, err)
		}
		if b, err := os.ReadFile(p("sym")); err != nil || string(b) != "hello world" {
			return fmt.Errorf("read through symlink: %q %v", b, err)
		}

		// chmod, chown, utimes, truncate.
		if err := os.Chmod(p("hard"), 0o604); err != nil {
			return err
		}
		if err := os.Chown(p("hard"), 1234, 5678); err != nil {
			return err
		}
		mtime := time.Unix(1000000000, 123456789)
		if err := os.Chtimes(p("hard"), mtime, mtime); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(m.dir, "hard"), &st); err != nil {
			return err
		}
		if st.Mode&07777 != 0o604 || st.Uid != 1234 || st.Gid != 5678 || st.Mtim.Sec != 1000000000 || st.Mtim.Nsec != 123456789 {
			return fmt.Errorf("backing attributes: mode %o uid %d gid %d mtime %v", st.Mode, st.Uid, st.Gid, st.Mtim)
		}
		if err := os.Truncate(p("hard"), 5); err != nil {
			return err
		}
		if b, err := os.ReadFile(p("D/a2")); err != nil || string(b) != "hello" {
			return fmt.Errorf("after truncate: %q %v", b, err)
		}
		if err := os.Lchown(p("sym"), 42, 43); err != nil {
			return err
		}

		// Extended attributes.
		if err := unix.Setxattr(p("hard"), "user.k", []byte("v1"), 0); err != nil {
			return fmt.Errorf("setxattr: %w", err)
		}
		buf := make([]byte, 64)
		n, err := unix.Getxattr(p("hard"), "user.k", buf)
		if err != nil || string(buf[:n]) != "v1" {
			return fmt.Errorf("getxattr: %q %v", buf[:max(n, 0)], err)
		}
		n, err = unix.Listxattr(p("hard"), buf)
		if err != nil || !bytes.Contains(buf[:n], []byte("user.k\x00")) {
			return fmt.Errorf("listxattr: %q %v", buf[:max(n, 0)], err)
		}
		if err := unix.Removexattr(p("hard"), "user.k"); err != nil {
			return err
		}
		if _, err := unix.Getxattr(p("hard"), "user.k", buf); err != unix.ENODATA {
			return fmt.Errorf("getxattr after remove: %v", err)
		}

		// An unlinked open file keeps working through its fd.
		f, err = os.OpenFile(p("tmp"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteString("before"); err != nil {
			return err
		}
		if err := os.Remove(p("tmp")); err != nil {
			return err
		}
		if _, err := f.WriteString(" after"); err != nil {
			return err
		}
		got := make([]byte, 32)
		n, err = f.ReadAt(got, 0)
		if string(got[:n]) != "before after" {
			return fmt.Errorf("read of unlinked file: %q %v", got[:n], err)
		}
		if fi, err := f.Stat(); err != nil || fi.Size() != 12 {
			return fmt.Errorf("fstat of unlinked file: %v %v", fi, err)
		}
		if err := f.Truncate(3); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if _, err := os.Stat(p("tmp")); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unlinked name: %v", err)
		}
		return nil
	})
}

func TestMountBigDir(t *testing.T) {
	for _, plus := range []bool{true, false} {
		t.Run("readdirplus="+strconv.FormatBool(plus), func(t *testing.T) {
			m := mount(t, fuse.MountOptions{DisableReadDirPlus: !plus})
			want := make([]string, 10000)
			for i := range want {
				want[i] = fmt.Sprintf("file-%05d", i)
				if err := os.WriteFile(filepath.Join(m.dir, want[i]), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m.within(t, func() error {
				ents, err := os.ReadDir(m.mnt)
				if err != nil {
					return err
				}
				got := make([]string, len(ents))
				for i, e := range ents {
					got[i] = e.Name()
				}
				sort.Strings(got)
				if !slices.Equal(got, want) {
					return fmt.Errorf("listed %d entries, want %d", len(got), len(want))
				}
				return nil
			})
		})
	}
}

func TestMountGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is not on PATH: install it (apt-get install -y git)")
	}
	m := mount(t, fuse.MountOptions{})
	home := t.TempDir()
	m.within(t, func() error {
		for name, data := range map[string]string{"README": "hello\n", "src/main.go": "package main\n", "src/x/y.txt": "y\n"} {
			p := filepath.Join(m.mnt, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
				return err
			}
		}
		for _, args := range [][]string{
			{"init", "-q"},
			{"add", "."},
			{"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "first"},
			{"fsck", "--strict"},
			{"gc", "-q"},
			{"fsck", "--strict"},
			{"log", "--oneline"},
		} {
			// git -C, not cmd.Dir: a child that chdirs into the mount
			// between fork and exec can stall this process's own server
			// (the Go runtime cannot start threads while the vfork lasts).
			cmd := exec.Command("git", append([]string{"-C", m.mnt}, args...)...)
			cmd.Env = append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("git %v: %v: %s", args, err, out)
			}
		}
		return nil
	})
}

// TestMountExport exports the tables of a server the kernel is using, with a
// file open, and imports them into a server of a copy of the tree.
func TestMountExport(t *testing.T) {
	m := mount(t, fuse.MountOptions{})
	var state []byte
	m.within(t, func() error {
		if err := os.MkdirAll(filepath.Join(m.mnt, "w", "x"), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(m.mnt, "w", "x", "keep"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteString("parent data"); err != nil {
			return err
		}
		if state, err = m.srv.Export(); err != nil {
			return err
		}
		return f.Close()
	})
	copyDir := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", m.dir, copyDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	writeFile(t, filepath.Join(copyDir, "w", "x", "keep"), "clone data")
	s2 := newServer(t, copyDir)
	if err := s2.Import(state); err != nil {
		t.Fatal(err)
	}
	var files int
	for fh, h := range s2.handles {
		if h.dir {
			continue
		}
		files++
		if got, code := read(s2, fh, 0, 100); !code.Ok() || got != "clone data" {
			t.Errorf("read of imported kernel handle %d: %q %v", fh, got, code)
		}
		w := lookup(t, s2, rootID, "w")
		x := lookup(t, s2, w, "x")
		if got := lookup(t, s2, x, "keep"); got != h.node {
			t.Errorf("w/x/keep in the copy is node %d, the handle's node is %d", got, h.node)
		}
		release(s2, fh)
	}
	if files != 1 {
		t.Errorf("%d open files exported, want 1", files)
	}
}
