package cowfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// asNobody runs a command as user nobody and returns its error.
func asNobody(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd.Run()
}

// TestMountClosedToOtherUsers checks that another user can neither stat
// nor list a fresh mount, even below directories open to all, unless the
// mount was made with AllowOther.
func TestMountClosedToOtherUsers(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"file": "f"})
	os.Chmod(src, 0o755)
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	// A parent every user may enter, with a plain directory beside the
	// mount point to show that nobody gets that far.
	parent, err := os.MkdirTemp("", "cowfs-exposure-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	for _, d := range []string{"plain", "mnt"} {
		if err := os.Mkdir(filepath.Join(parent, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(parent, 0o755)
	if err := asNobody("ls", filepath.Join(parent, "plain")); err != nil {
		t.Fatalf("nobody cannot list a 0755 directory: %v", err)
	}
	for i, allow := range []bool{false, true} {
		name := []string{"closed", "open"}[i]
		if err := f.Branch(ctx, snap, name); err != nil {
			t.Fatal(err)
		}
		mnt := filepath.Join(parent, "mnt")
		m, err := f.Mount(ctx, name, mnt, &MountOptions{AllowOther: allow})
		if err != nil {
			t.Fatal(err)
		}
		lsErr := asNobody("ls", mnt)
		statErr := asNobody("stat", filepath.Join(mnt, "file"))
		if err := m.Unmount(); err != nil {
			t.Fatal(err)
		}
		if allow && (lsErr != nil || statErr != nil) {
			t.Errorf("AllowOther: nobody cannot list (%v) or stat (%v) inside the mount", lsErr, statErr)
		}
		if !allow && (lsErr == nil || statErr == nil) {
			t.Errorf("default mount: nobody listed (err %v) or stat'ed (err %v) inside the mount", lsErr, statErr)
		}
	}
}

// TestPoolDirPrivate checks that a pool makes its directory 0700 and
// refuses an existing one other users can enter, unless AllowOther.
func TestPoolDirPrivate(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	ctx := context.Background()
	p := newTestPool(t, f, 1)
	if st, err := os.Stat(p.Dir()); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("pool dir mode %v (%v), want 0700", st.Mode(), err)
	}
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := f.NewMountPool(ctx, open, 1, nil)
	if err == nil || !strings.Contains(err.Error(), "chmod 700 "+open) {
		t.Fatalf("pool in a 0755 dir: %v, want a refusal saying chmod 700", err)
	}
	shared, err := f.NewMountPool(ctx, open, 1, &MountOptions{AllowOther: true})
	if err != nil {
		t.Fatalf("pool in a 0755 dir with AllowOther: %v", err)
	}
	shared.Close()
}

// TestOpenRefusesLooseStateRoot checks that Open refuses a state root, or
// a directory in it, that another user could change, and creates new
// ones private.
func TestOpenRefusesLooseStateRoot(t *testing.T) {
	fresh := filepath.Join(t.TempDir(), "root")
	f, err := Open(fresh, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, d := range []string{"", "branches", "cache"} {
		if st, err := os.Stat(filepath.Join(fresh, d)); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("new state dir %q: mode %v (%v), want 0700", d, st.Mode(), err)
		}
	}
	for _, c := range []struct {
		dir  string
		mode os.FileMode
		uid  int
		want string
	}{
		{"", 0o777, -1, "chmod 755 "},
		{"", 0o770, -1, "chmod 750 "},
		{"store", 0o757, -1, "chmod 755 "},
		{"branches", 0o733, -1, "chmod 711 "},
		{"cache", os.ModeSticky | 0o777, -1, "chmod 1755 "},
		{"", 0o700, 65534, "chown "},
	} {
		root := filepath.Join(t.TempDir(), "root")
		f, err := Open(root, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		p := filepath.Join(root, c.dir)
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		if c.uid >= 0 {
			if err := os.Chown(p, c.uid, -1); err != nil {
				t.Fatal(err)
			}
		}
		_, err = Open(root, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("Open with %s mode %v uid %d: %v, want an error naming %s and saying %q", p, c.mode, c.uid, err, p, c.want)
		}
	}
}

// TestModeZero: a file or directory with no permission bits shows mode 0
// and is closed to other users, as on any file system (go-fuse shows
// 0644/0755 for a zero mode unless told not to).
func TestModeZero(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"imported": "secret\n"})
	os.Chmod(src, 0o755)
	os.Chmod(filepath.Join(src, "imported"), 0)
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Branch(ctx, snap, "z"); err != nil {
		t.Fatal(err)
	}
	parent, err := os.MkdirTemp("", "cowfs-mode0-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	os.Chmod(parent, 0o755)
	mnt := filepath.Join(parent, "mnt")
	os.Mkdir(mnt, 0o755)
	m, err := f.Mount(ctx, "z", mnt, &MountOptions{AllowOther: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmount()
	if err := os.WriteFile(filepath.Join(mnt, "written"), []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"written", "dir"} {
		if err := os.Chmod(filepath.Join(mnt, n), 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"imported", "written", "dir"} {
		st, err := os.Stat(filepath.Join(mnt, n))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0 {
			t.Errorf("%s: mode %v after chmod 0", n, st.Mode())
		}
	}
	if err := asNobody("stat", filepath.Join(mnt, "written")); err != nil {
		t.Fatalf("nobody cannot stat in the mount at all, so the checks below prove nothing: %v", err)
	}
	for _, c := range [][]string{{"cat", filepath.Join(mnt, "imported")}, {"cat", filepath.Join(mnt, "written")}, {"ls", filepath.Join(mnt, "dir")}} {
		if err := asNobody(c[0], c[1:]...); err == nil {
			t.Errorf("nobody ran %q on a mode 000 entry", c)
		}
	}
}
