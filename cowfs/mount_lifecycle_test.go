package cowfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// noMountAt fails the test if anything is mounted at path.
func noMountAt(t *testing.T, path string) {
	t.Helper()
	ms, err := mountsAt(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) > 0 {
		unix.Unmount(path, unix.MNT_DETACH)
		t.Errorf("%d mounts left at %s", len(ms), path)
	}
}

// TestMountFailuresLeaveNothing checks every way Mount, serve and the pool
// fail: none leaves a mount, a record or a reserved branch behind.
func TestMountFailuresLeaveNothing(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "a"})
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Branch(ctx, snap, "main"); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	file := filepath.Join(tmp, "afile")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, branch, dir, want string }{
		{"regular file", "main", file, "not a directory"},
		{"missing dir", "main", filepath.Join(tmp, "missing"), "no such file"},
		{"missing branch", "nope", t.TempDir(), "no such branch"},
	} {
		_, err := f.Mount(ctx, c.branch, c.dir, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Mount error %v, want one saying %q", c.name, err, c.want)
		}
		noMountAt(t, c.dir)
	}

	// The mount syscall succeeds but the server cannot start (the
	// mount point turned out to be a file): the mount is taken down.
	if _, _, _, err := mountFUSE(file, &node{b: f.newBranch()}, f.newBackings(), fuseOptions("tine:test", &MountOptions{}), true); err == nil {
		t.Error("mountFUSE on a regular file succeeded")
	}
	noMountAt(t, file)

	// A pool whose directory is a file, and a pool binding a missing
	// branch: nothing extra stays mounted.
	if _, err := f.NewMountPool(ctx, file, 1, nil); err == nil {
		t.Error("NewMountPool on a regular file succeeded")
	}
	noMountAt(t, file)
	p := newTestPool(t, f, 2)
	if _, err := p.Mount(ctx, "nope"); err == nil {
		t.Error("pool Mount of a missing branch succeeded")
	}
	if got := mountsUnder(t, p.Dir()); len(got) != 2 {
		t.Errorf("%d mounts under the pool after a failed bind, want 2: %v", len(got), got)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mountsUnder(t, p.Dir()); len(got) != 0 {
		t.Errorf("mounts left after pool Close: %v", got)
	}

	// After all that, the branch mounts.
	m, err := f.Mount(ctx, "main", t.TempDir(), nil)
	if err != nil {
		t.Fatalf("mount after failures: %v", err)
	}
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
}

// TestMountBusyNamesHolder checks that a second mount of a branch names
// the process that holds it.
func TestMountBusyNamesHolder(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	mountNew(t, f, "main", map[string]string{"a": "a"})
	_, err := f.Mount(context.Background(), "main", t.TempDir(), nil)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("second Mount: %v, want ErrBusy", err)
	}
	for _, want := range []string{"process " + strconv.Itoa(os.Getpid()), os.Args[0]} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("second Mount error %q does not name %q", err, want)
		}
	}
}

// startServer runs the test binary as a child that opens root and
// serves branch main at mnt (or from a pool at mnt when pool is set),
// and waits until it is mounted.
func startServer(t *testing.T, root, mnt string, pool bool) *exec.Cmd {
	t.Helper()
	arg := root + " " + mnt
	if pool {
		arg += " pool"
	}
	cmd := startChild(t, crashEnv+"="+arg, "READY")
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// newRoot makes a state root with branch main holding file a.
func newRoot(t *testing.T) string {
	return rootWithMain(t, map[string]string{"a": "content of a"}, "")
}

// TestStaleMountCleanedAfterKill SIGKILLs the process serving a mount:
// while it runs, another process is refused with its pid and command
// line; once it is dead, the next Open detaches its dead mount and the
// branch mounts again at the same place.
func TestStaleMountCleanedAfterKill(t *testing.T) {
	needFUSE(t)
	for _, pool := range []bool{false, true} {
		t.Run(map[bool]string{false: "mount", true: "pool"}[pool], func(t *testing.T) {
			ctx := context.Background()
			root := newRoot(t)
			mnt := filepath.Join(t.TempDir(), "m")
			if err := os.Mkdir(mnt, 0o700); err != nil {
				t.Fatal(err)
			}
			cmd := startServer(t, root, mnt, pool)
			t.Cleanup(func() { unmountAllUnder(mnt) })

			_, err := Open(root, nil)
			if !errors.Is(err, chunkstore.ErrLocked) {
				t.Fatalf("Open while another process serves: %v, want ErrLocked", err)
			}
			for _, want := range []string{"process " + strconv.Itoa(cmd.Process.Pid), os.Args[0]} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Open error %q does not name %q", err, want)
				}
			}

			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			dead := mnt
			if pool {
				dead = filepath.Join(mnt, "1")
			}
			var st unix.Statfs_t
			if err := unix.Statfs(dead, &st); !deadErr(err) {
				t.Fatalf("statfs of the killed server's mount: %v, want ENOTCONN, ECONNABORTED or ECANCELED", err)
			}

			f, err := Open(root, nil)
			if err != nil {
				t.Fatalf("Open after the server was killed: %v", err)
			}
			defer f.Close()
			if err := unix.Statfs(dead, &st); err != nil {
				t.Errorf("statfs after Open cleaned up: %v", err)
			}
			if pool {
				if got := mountsUnder(t, mnt); len(got) > 0 {
					t.Errorf("mounts left under the pool dir: %v", got)
				}
			} else {
				noMountAt(t, mnt)
			}

			var m *Mount
			if pool {
				p, err := f.NewMountPool(ctx, mnt, 1, nil)
				if err != nil {
					t.Fatalf("new pool at the killed pool's dir: %v", err)
				}
				defer p.Close()
				m, err = p.Mount(ctx, "main")
				if err != nil {
					t.Fatalf("pool mount after kill: %v", err)
				}
			} else if m, err = f.Mount(ctx, "main", mnt, nil); err != nil {
				t.Fatalf("remount at the same dir after kill: %v", err)
			}
			defer m.Unmount()
			if b, err := os.ReadFile(filepath.Join(m.Dir(), "a")); err != nil || string(b) != "content of a" {
				t.Errorf("read after remount: %q, %v", b, err)
			}
		})
	}
}

// TestMountOnDeadMountSaysWhatToRun checks that a dead mount this root
// has no record of is refused with the command that removes it.
func TestMountOnDeadMountSaysWhatToRun(t *testing.T) {
	needFUSE(t)
	root := newRoot(t)
	mnt := filepath.Join(t.TempDir(), "m")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := startServer(t, root, mnt, false)
	t.Cleanup(func() { unmountAllUnder(mnt) })
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	// Another root: its Open leaves the first root's dead mount alone.
	f := openTestFS(t)
	snap, err := f.Import(context.Background(), t.TempDir(), "")
	if err == nil {
		err = f.Branch(context.Background(), snap, "main")
	}
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Mount(context.Background(), "main", mnt, nil)
	if err == nil || !strings.Contains(err.Error(), "fusermount3 -u "+mnt) {
		t.Fatalf("Mount on a dead mount: %v, want the fusermount3 command", err)
	}
}

// unmountAllUnder lazily unmounts dir and anything below it.
func unmountAllUnder(dir string) {
	for range 8 {
		unix.Unmount(dir, unix.MNT_DETACH)
	}
	subs, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, s := range subs {
		unix.Unmount(s, unix.MNT_DETACH)
	}
}
