package sandbox

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"tine/cowfs"
)

// TestStalenessTooDeep: a host tree deeper than a path can name is not
// reported as removed: the walk leaves what it cannot name uncompared and
// says Partial.
func TestStalenessTooDeep(t *testing.T) {
	base := t.TempDir()
	fs, err := cowfs.Open(filepath.Join(base, "cowfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	dir := filepath.Join(base, "project")
	if err := unix.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// 40 levels of 200-byte names: 8 KiB of path, made one level at a time.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("d", 200)
	for range 40 {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	snap, err := fs.Import(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := compareHost(context.Background(), fs, snap, dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if s.Removed != 0 || s.Changed != 0 || s.Added != 0 || !s.Partial {
		t.Fatalf("an unchanged tree deeper than PATH_MAX: %+v, want nothing counted and Partial", s)
	}
}
