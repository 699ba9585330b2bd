package cowfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// An O_TMPFILE file named later with linkat appears with its content and
// is in the next snapshot; one opened with O_EXCL cannot be named.
func TestTmpfileLinkat(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{"keep": "k"})
	fd, err := unix.Open(m.Dir(), unix.O_TMPFILE|unix.O_RDWR, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, []byte("made unnamed"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, filepath.Join(m.Dir(), "named"), unix.AT_SYMLINK_FOLLOW); err != nil {
		t.Fatalf("linkat: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(m.Dir(), "named")); err != nil || string(b) != "made unnamed" {
		t.Fatalf("named = %q, %v", b, err)
	}
	snap, err := f.Snapshot(context.Background(), "main")
	if err != nil {
		t.Fatal(err)
	}
	changes, err := f.Diff(context.Background(), base, snap)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range changes {
		if c.Path == "named" && c.Kind == Added && c.New.Size == int64(len("made unnamed")) && c.New.Nlink <= 1 {
			found = true
		}
	}
	if !found {
		t.Fatalf("snapshot lacks the linked tmpfile: %+v", changes)
	}

	excl, err := unix.Open(m.Dir(), unix.O_TMPFILE|unix.O_RDWR|unix.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(excl)
	if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", excl), unix.AT_FDCWD, filepath.Join(m.Dir(), "excl"), unix.AT_SYMLINK_FOLLOW); err == nil {
		t.Fatal("linkat of an O_EXCL tmpfile succeeded")
	}
}
