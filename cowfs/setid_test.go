package cowfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSetIDBitsAsOnHost checks that writes, truncations and chowns clear
// the set-user-ID and set-group-ID bits in a branch exactly as the host's
// own file system does, for an unprivileged caller and for root. With
// FUSE_HANDLE_KILLPRIV_V2 (ADR 0187) the kernel leaves part of that to
// cowfs: a truncation by an unprivileged caller only asks for it.
func TestSetIDBitsAsOnHost(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	ctx := context.Background()
	parent, err := os.MkdirTemp("", "cowfs-setid-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	host, mnt := filepath.Join(parent, "host"), filepath.Join(parent, "mnt")
	for _, d := range []string{host, mnt} {
		must(t, os.Mkdir(d, 0o755))
	}
	must(t, os.Chmod(parent, 0o755))
	must(t, os.Chmod(host, 0o777))
	snap, err := f.Import(ctx, t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	must(t, f.Branch(ctx, snap, "main"))
	m, err := f.Mount(ctx, "main", mnt, &MountOptions{AllowOther: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmount()
	must(t, os.Chmod(mnt, 0o777))

	nobody := func(script, file string) func() error {
		return func() error {
			cmd := exec.Command("sh", "-c", script, "sh", file)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Logf("%s: %s", script, out)
			}
			return err
		}
	}
	cases := []struct {
		name string
		mode uint32
		op   func(file string) func() error
		kept bool // the host keeps the bits
	}{
		{"nobody writes suid", 0o4777, func(p string) func() error { return nobody(`printf x >> "$1"`, p) }, false},
		{"nobody writes sgid g+x", 0o2777, func(p string) func() error { return nobody(`printf x >> "$1"`, p) }, false},
		{"nobody writes sgid g-x", 0o2767, func(p string) func() error { return nobody(`printf x >> "$1"`, p) }, true},
		{"nobody truncates suid", 0o6777, func(p string) func() error { return nobody(`truncate -s 1 "$1"`, p) }, false},
		{"nobody opens suid O_TRUNC", 0o6777, func(p string) func() error { return nobody(`: > "$1"`, p) }, false},
		{"root writes suid", 0o6755, func(p string) func() error {
			return func() error { return appendByte(p) }
		}, true},
		{"root truncates suid", 0o6755, func(p string) func() error {
			return func() error { return os.Truncate(p, 1) }
		}, true},
		{"root chowns suid", 0o6755, func(p string) func() error {
			return func() error { return os.Chown(p, 0, 0) }
		}, false},
	}
	for i, c := range cases {
		var modes [2]uint32
		for j, dir := range []string{host, m.Dir()} {
			p := filepath.Join(dir, "f"+string(rune('a'+i)))
			must(t, os.WriteFile(p, []byte("data"), 0o600))
			must(t, os.Chown(p, 65534, 65534))
			must(t, syscall.Chmod(p, c.mode))
			if err := c.op(p)(); err != nil {
				t.Fatalf("%s in %s: %v", c.name, dir, err)
			}
			var st syscall.Stat_t
			must(t, syscall.Stat(p, &st))
			modes[j] = st.Mode & 0o7777
		}
		if modes[0] != modes[1] {
			t.Errorf("%s: mode %o in the branch, %o on the host", c.name, modes[1], modes[0])
		}
		if kept := modes[0]&0o6000 == c.mode&0o6000; kept != c.kept {
			t.Errorf("%s: the host left mode %o (from %o); the case does not test what it says", c.name, modes[0], c.mode)
		}
	}
}

func appendByte(p string) error {
	fh, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = fh.Write([]byte("x"))
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}
