package cowfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSnapshotHoldsMappedWrites: bytes written through a shared writable
// mapping, not yet sent to cowfs by the kernel (no msync, still mapped),
// are in a snapshot and a head taken after the write.
func TestSnapshotHoldsMappedWrites(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"mapped": "........"})
	ctx := context.Background()
	fh, err := os.OpenFile(filepath.Join(m.Dir(), "mapped"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	mem, err := unix.Mmap(int(fh.Fd()), 0, 8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i, step := range []struct {
		write string
		take  func() (SnapshotID, error)
	}{
		{"WRITTEN1", func() (SnapshotID, error) { return f.Snapshot(ctx, "main") }},
		{"WRITTEN2", func() (SnapshotID, error) { return f.Head(ctx, "main") }},
	} {
		copy(mem, step.write)
		id, err := step.take()
		if err != nil {
			t.Fatal(err)
		}
		tree, err := readSnapTree(f, id)
		if err != nil {
			t.Fatal(err)
		}
		if got := tree["mapped"].data; got != step.write {
			t.Errorf("step %d: the file in the snapshot holds %q, the mapping %q", i, got, step.write)
		}
	}
}
