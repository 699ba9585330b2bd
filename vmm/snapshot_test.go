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
	"time"

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
	runBounded(t, vm)
	want := vm.Reports()
	if len(want) != 2 || vm.ExitCode() != 3 {
		t.Fatalf("uninterrupted run reported %v, exit %d", want, vm.ExitCode())
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"image", "lazy", "file"} {
		out := restoreInProcess(t, dir+","+root.String()+","+mode)
		wantLine := fmt.Sprintf("RESULT %d %d exit 3", want[0], want[1])
		if !strings.Contains(out, wantLine) {
			t.Fatalf("restore process (%s) did not print %q:\n%s", mode, wantLine, out)
		}
	}
}

// guestTimeout bounds a test guest's run: a guest that reads a wrong page
// can loop forever, and its test must then fail rather than hang.
const guestTimeout = 2 * time.Minute

// runWithin runs vm to its end, or for guestTimeout at most.
func runWithin(vm *VM) error {
	ctx, cancel := context.WithTimeout(context.Background(), guestTimeout)
	defer cancel()
	return vm.Run(ctx)
}

// runBounded runs vm to its end, failing the test if it fails or takes
// longer than guestTimeout.
func runBounded(t *testing.T, vm *VM) {
	t.Helper()
	if err := runWithin(vm); err != nil {
		t.Fatalf("guest run (limit %v): %v", guestTimeout, err)
	}
}

// restoreInProcess runs this test binary as a restore process (see
// TestMain) with arg, and returns its output; it fails the test if the
// process fails or runs longer than guestTimeout.
func restoreInProcess(t *testing.T, arg string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guestTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "TINE_VMM_RESTORE="+arg)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("restore process (%s) did not end within %v:\n%s", arg, guestTimeout, out)
	}
	if err != nil {
		t.Fatalf("restore process (%s): %v\n%s", arg, err, out)
	}
	return string(out)
}

// TestMain lets the test binary act as the restore process of
// TestSnapshotRestoreInNewProcess.
func TestMain(m *testing.M) {
	if arg := os.Getenv("TINE_VMM_RESTORE"); arg != "" {
		if err := restoreProcess(arg); err != nil {
			fmt.Fprintln(os.Stderr, "restore process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// restoreProcess restores a snapshot ("dir,root,mode") in this fresh
// process, runs it to the end and prints what it reported.
func restoreProcess(arg string) error {
	parts := strings.Split(arg, ",")
	if len(parts) != 3 {
		return fmt.Errorf("bad argument %q", arg)
	}
	if parts[2] == "dir" {
		return restoreDir(parts[0])
	}
	store, err := chunkstore.Open(parts[0], nil)
	if err != nil {
		return err
	}
	defer store.Close()
	root, err := chunkstore.ParseID(parts[1])
	if err != nil {
		return err
	}
	var img *Image
	opts := ForkOptions{}
	switch parts[2] {
	case "lazy":
		img, err = OpenSnapshotLazy(store, root, Config{})
		opts.Mode = ForkUserfault
	case "file":
		b, err := os.ReadFile(filepath.Join(parts[0], "state"))
		if err != nil {
			return err
		}
		st, err := UnmarshalState("state file", b)
		if err != nil {
			return err
		}
		img, err = OpenImageFile(filepath.Join(parts[0], "image"), st, Config{})
		if err != nil {
			return err
		}
	default:
		img, err = LoadSnapshot(context.Background(), store, root, Config{})
	}
	if err != nil {
		return err
	}
	defer img.Close()
	kids, err := img.Fork(context.Background(), 1, opts)
	if err != nil {
		return err
	}
	vm := kids[0]
	defer vm.Close()
	if err := vm.Run(context.Background()); err != nil {
		return err
	}
	r := vm.Reports()
	if len(r) != 2 {
		return fmt.Errorf("restored VM reported %v", r)
	}
	fmt.Printf("RESULT %d %d exit %d\n", r[0], r[1], vm.ExitCode())
	return nil
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

// TestSnapshotOfChild snapshots VMs whose RAM is mapped from an image (in
// both fork modes) and checks that the stored snapshot holds exactly
// their memory: pages from the image and pages they wrote.
func TestSnapshotOfChild(t *testing.T) {
	prog := buildGuest(t, `
void main(u64 memsize) {
	volatile u64 *a = (u64 *)0x1000000;
	for (u64 i = 0; i < 64; i++) a[i * 512] = i + 1;
	u64 id = fork(1);
	if (id) for (u64 i = 32; i < 96; i++) a[i * 512] = 1000 + i;
	exit(0);
}`)
	for _, mode := range []ForkMode{ForkMapPrivate, ForkUserfault} {
		store := openStore(t, t.TempDir())
		var kids []*VM
		var img *Image
		onRequest := func(ctx context.Context, vm *VM, req Request) (uint64, error) {
			var err error
			img, kids, err = vm.Fork(ctx, 1, ForkOptions{IndexInRAX: true, Mode: mode})
			return 0, err
		}
		parent := newBare(t, 32<<20, prog, Config{OnRequest: onRequest})
		if err := parent.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		child := kids[0]
		if err := child.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, vm := range []*VM{parent, child} {
			root, _, err := vm.Snapshot(context.Background(), store)
			if err != nil {
				t.Fatal(err)
			}
			snap, err := LoadSnapshot(context.Background(), store, root, Config{})
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, snap.Size())
			if _, err := readFull(snap.Fd(), got); err != nil {
				t.Fatal(err)
			}
			snap.Close()
			if !bytes.Equal(got, vm.Mem()) {
				t.Errorf("mode %d, VM %d: snapshot differs from the VM's memory", mode, vm.Index())
			}
		}
		if v, _ := child.guestU64(0x1000000 + 40*4096); v != 1040 {
			t.Errorf("child's page 40 = %d, want 1040", v)
		}
		if v, _ := parent.guestU64(0x1000000 + 40*4096); v != 41 {
			t.Errorf("parent's page 40 = %d, want 41", v)
		}
		child.Close()
		img.Close()
		store.Close()
	}
}

// restoreDir opens an image directory in this fresh process, clones it,
// runs the clone to the end and prints the times and what it reported.
func restoreDir(dir string) error {
	opts := ForkOptions{}
	start := time.Now()
	img, _, err := OpenImageDir(dir, Config{})
	if err != nil {
		return err
	}
	defer img.Close()
	opened := time.Since(start)
	kids, err := img.Fork(context.Background(), 1, opts)
	if err != nil {
		return err
	}
	fmt.Printf("open %v, open+clone %v\n", opened, time.Since(start))
	vm := kids[0]
	defer vm.Close()
	if err := vm.Run(context.Background()); err != nil {
		return err
	}
	r := vm.Reports()
	if len(r) != 2 {
		return fmt.Errorf("restored VM reported %v", r)
	}
	fmt.Printf("RESULT %d %d exit %d\n", r[0], r[1], vm.ExitCode())
	return nil
}
