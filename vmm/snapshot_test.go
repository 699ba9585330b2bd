package vmm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/chunkstore"
)

// computeGuest does work on both sides of a snapshot request, keeping live
// values in registers and memory across it.
const computeGuest = `
void main(u64 memsize) {
	volatile u64 *a = (u64 *)0x1000000;
	u64 x = 88172645463325252UL;
	for (u64 i = 0; i < 20000; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; a[(x % 8192) * 64] += x; }
	snapshot();
	for (u64 i = 0; i < 20000; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; a[(x % 8192) * 64] ^= x; }
	u64 sum = 0;
	for (u64 i = 0; i < 8192; i++) sum += a[i * 64] * (i + 1);
	report((u32)sum);
	report((u32)(sum >> 32));
	exit(3);
}`

func openStore(t testing.TB, dir string) *chunkstore.Store {
	t.Helper()
	s, err := chunkstore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSnapshotRestoreInNewProcess snapshots a guest half way, restores the
// snapshot in a fresh process and checks that it finishes with the same
// result as the uninterrupted run.
func TestSnapshotRestoreInNewProcess(t *testing.T) {
	prog := buildGuest(t, computeGuest)
	dir := t.TempDir()
	store := openStore(t, dir)
	var root chunkstore.ID
	onRequest := func(ctx context.Context, vm *VM, req Request) (uint64, error) {
		id, _, err := vm.Snapshot(ctx, store)
		if err != nil {
			return 0, err
		}
		root = id
		// Also seal a flat image file with its state for MAP_PRIVATE
		// restore.
		img, err := vm.Seal()
		if err != nil {
			return 0, err
		}
		defer img.Close()
		if err := img.WriteFile(filepath.Join(dir, "image")); err != nil {
			return 0, err
		}
		b, err := img.State().MarshalBinary()
		if err != nil {
			return 0, err
		}
		return 0, os.WriteFile(filepath.Join(dir, "state"), b, 0o600)
	}
	vm := newBare(t, 128<<20, prog, Config{OnRequest: onRequest})
	if err := vm.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := vm.Reports()
	if len(want) != 2 || vm.ExitCode() != 3 {
		t.Fatalf("uninterrupted run reported %v, exit %d", want, vm.ExitCode())
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"image", "lazy", "file"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRestoreHelper$", "-test.v")
		cmd.Env = append(os.Environ(), "TINE_VMM_RESTORE="+dir+","+root.String()+","+mode)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("restore process (%s): %v\n%s", mode, err, out)
		}
		wantLine := fmt.Sprintf("RESULT %d %d exit 3", want[0], want[1])
		if !strings.Contains(string(out), wantLine) {
			t.Fatalf("restore process (%s) did not print %q:\n%s", mode, wantLine, out)
		}
	}
}

// TestRestoreHelper runs only as the child process of
// TestSnapshotRestoreInNewProcess.
func TestRestoreHelper(t *testing.T) {
	arg := os.Getenv("TINE_VMM_RESTORE")
	if arg == "" {
		t.Skip("runs only as the restore process of TestSnapshotRestoreInNewProcess")
	}
	parts := strings.Split(arg, ",")
	store := openStore(t, parts[0])
	defer store.Close()
	root, err := chunkstore.ParseID(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var img *Image
	opts := ForkOptions{}
	switch parts[2] {
	case "lazy":
		img, err = OpenSnapshotLazy(store, root, Config{})
		opts.Mode = ForkUserfault
	case "file":
		var b []byte
		b, err = os.ReadFile(filepath.Join(parts[0], "state"))
		if err != nil {
			t.Fatal(err)
		}
		var st *State
		st, err = UnmarshalState("state file", b)
		if err != nil {
			t.Fatal(err)
		}
		img, err = OpenImageFile(filepath.Join(parts[0], "image"), st, Config{})
	default:
		img, err = LoadSnapshot(context.Background(), store, root, Config{})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	kids, err := img.Fork(context.Background(), 1, opts)
	if err != nil {
		t.Fatal(err)
	}
	vm := kids[0]
	defer vm.Close()
	if err := vm.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := vm.Reports()
	if len(r) != 2 {
		t.Fatalf("restored VM reported %v", r)
	}
	fmt.Printf("RESULT %d %d exit %d\n", r[0], r[1], vm.ExitCode())
}

func TestIncrementalSnapshot(t *testing.T) {
	prog := buildGuest(t, `
void main(u64 memsize) {
	volatile u64 *a = (u64 *)0x1000000;
	for (u64 i = 0; i < 1000; i++) a[i * 512] = i + 1;
	snapshot();
	for (u64 i = 0; i < 5; i++) a[i * 512 * 100] = 77;
	snapshot();
	snapshot();
	exit(0);
}`)
	store := openStore(t, t.TempDir())
	defer store.Close()
	var stats []SnapshotStats
	var roots []chunkstore.ID
	onRequest := func(ctx context.Context, vm *VM, req Request) (uint64, error) {
		id, st, err := vm.Snapshot(ctx, store)
		stats = append(stats, st)
		roots = append(roots, id)
		return 0, err
	}
	vm := newBare(t, 64<<20, prog, Config{OnRequest: onRequest, DirtyLog: true})
	if err := vm.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(stats) != 3 {
		t.Fatalf("%d snapshots, want 3", len(stats))
	}
	t.Logf("snapshots: %+v", stats)
	if stats[0].Incremental || stats[0].PagesStored < 1000 {
		t.Errorf("first snapshot: %+v, want a full one storing >= 1000 pages", stats[0])
	}
	// 5 data pages plus the stack page; nothing else was written.
	if !stats[1].Incremental || stats[1].PagesHashed < 5 || stats[1].PagesHashed > 8 {
		t.Errorf("second snapshot hashed %d pages (%+v), want 5 data pages and the stack", stats[1].PagesHashed, stats[1])
	}
	if stats[2].PagesHashed > 3 {
		t.Errorf("third snapshot hashed %d pages, want only the stack", stats[2].PagesHashed)
	}
	// The incremental snapshot restores to the same memory.
	img, err := LoadSnapshot(context.Background(), store, roots[1], Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	got := make([]byte, img.Size())
	if _, err := readFull(img.Fd(), got); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int{0x1000000, 0x1000000 + 512*8*100, 0x1000000 + 999*4096} {
		if !bytes.Equal(got[off:off+4096], vm.Mem()[off:off+4096]) {
			t.Errorf("page at %#x differs between the snapshot and the VM", off)
		}
	}
	if v := got[0x1000000+100*4096]; v != 77 {
		t.Errorf("byte at page 100 of the array = %d, want 77", v)
	}
}
