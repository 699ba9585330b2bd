package vmm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const forkGuest = `
#define N 4096
void main(u64 memsize) {
	volatile u64 *a = (u64 *)0x400000;
	for (u64 i = 0; i < N; i++) a[i * 512] = i;
	u64 id = fork(2);
	u64 depth = id;
	if (id == 1) { u64 g = fork(1); if (g) depth = 10 + g; }
	a[(20 + depth) * 512] = 7000 + depth;
	u64 sum = 0;
	for (u64 i = 0; i < N; i++) sum += a[i * 512];
	report((u32)depth);
	report((u32)sum);
	exit(0);
}`

// forkTree runs the fork guest: every fork request forks the requesting VM,
// and every VM runs to the end after the one that forked it, so that each
// child starts after its parent and older siblings wrote their pages.
func forkTree(t *testing.T, mode ForkMode) map[uint32]uint32 {
	prog := buildGuest(t, forkGuest)
	var mu sync.Mutex
	var queue []*VM
	var images []*Image
	onRequest := func(ctx context.Context, vm *VM, req Request) (uint64, error) {
		if req.Kind != RequestFork {
			return 0, fmt.Errorf("unexpected request %d", req.Kind)
		}
		img, kids, err := vm.Fork(ctx, int(req.Arg), ForkOptions{IndexInRAX: true, Mode: mode})
		if err != nil {
			return 0, err
		}
		mu.Lock()
		queue = append(queue, kids...)
		images = append(images, img)
		mu.Unlock()
		return 0, nil
	}
	root := newBare(t, 64<<20, prog, Config{OnRequest: onRequest})
	// A failure stops the test with forks queued: close them, so that
	// their vCPUs are not counted live in the tests that follow.
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, vm := range queue {
			vm.Close()
		}
		for _, img := range images {
			img.Close()
		}
		queue, images = nil, nil
	})
	sums := map[uint32]uint32{}
	run := func(vm *VM) {
		if err := runWithin(vm); err != nil {
			t.Fatalf("VM (index %d, depth %d): %v", vm.Index(), vm.depth, err)
		}
		r := vm.Reports()
		if len(r) != 2 {
			t.Fatalf("VM (index %d) reported %v", vm.Index(), r)
		}
		if _, dup := sums[r[0]]; dup {
			t.Fatalf("two VMs report depth %d", r[0])
		}
		sums[r[0]] = r[1]
	}
	run(root)
	for {
		mu.Lock()
		if len(queue) == 0 {
			mu.Unlock()
			break
		}
		vm := queue[0] // stays queued while it runs, for the cleanup
		mu.Unlock()
		run(vm)
		mu.Lock()
		queue = queue[1:]
		mu.Unlock()
		vm.Close()
	}
	mu.Lock()
	for _, img := range images {
		img.Close()
	}
	images = nil
	mu.Unlock()
	return sums
}

func TestForkIsolation(t *testing.T) {
	const n = 4096
	base := uint32(n * (n - 1) / 2)
	for _, tc := range []struct {
		name string
		mode ForkMode
	}{{"map-private", ForkMapPrivate}, {"userfaultfd", ForkUserfault}} {
		t.Run(tc.name, func(t *testing.T) {
			sums := forkTree(t, tc.mode)
			// depth 0: root, 1 and 2: children, 11: child 1's child.
			for _, d := range []uint32{0, 1, 2, 11} {
				want := base - (20 + d) + 7000 + d
				got, ok := sums[d]
				if !ok {
					t.Errorf("no VM reported depth %d (got %v)", d, sums)
					continue
				}
				if got != want {
					t.Errorf("depth %d: sum %d, want %d: it saw another VM's writes", d, got, want)
				}
			}
			if len(sums) != 4 {
				t.Errorf("%d VMs ran, want 4: %v", len(sums), sums)
			}
		})
	}
}

func TestForkWithPool(t *testing.T) {
	prog := buildGuest(t, `
void main(u64 memsize) {
	volatile u64 *a = (u64 *)0x800000;
	a[0] = 41;
	snapshot();
	a[0] += 1;
	report((u32)a[0]);
	exit(0);
}`)
	var img *Image
	onRequest := func(ctx context.Context, vm *VM, req Request) (uint64, error) {
		var err error
		vm.Pause()
		defer vm.Resume()
		img, err = vm.Seal()
		return 0, err
	}
	vm := newBare(t, 32<<20, prog, Config{OnRequest: onRequest})
	if err := vm.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	pool, err := NewPool(context.Background(), img.cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ipool, err := NewImagePool(context.Background(), img, Config{}, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer ipool.Close()
	kids, err := img.Fork(context.Background(), 5, ForkOptions{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	more, err := img.Fork(context.Background(), 3, ForkOptions{Pool: ipool})
	if err != nil {
		t.Fatal(err)
	}
	kids = append(kids, more...)
	if pool.Len() != 0 || ipool.Len() != 0 {
		t.Errorf("pools still hold %d and %d VMs after 5 and 3 forks", pool.Len(), ipool.Len())
	}
	for _, k := range kids {
		if err := k.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := k.Reports(); len(r) != 1 || r[0] != 42 {
			t.Errorf("child %d reported %v, want [42]", k.Index(), r)
		}
		k.Close()
	}
	if r := vm.Reports(); len(r) != 1 || r[0] != 42 {
		t.Errorf("parent reported %v, want [42]", r)
	}
}

func TestFaultContainment(t *testing.T) {
	busy := buildGuest(t, `
void main(u64 memsize) {
	u64 x = 1;
	for (u64 i = 0; i < 300000000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
	report((u32)(x >> 32));
	exit(0);
}`)
	cases := []struct {
		name  string
		src   string
		setup func(vm *VM) error
		want  error
	}{
		{"unknown port", `void main(u64 m) { outl(0x1234, 1); }`, nil, ErrUnhandledPort},
		{"wild MMIO", `void main(u64 m) { *(volatile u32 *)(m + 0x100000) = 1; }`, nil, ErrUnhandledMMIO},
		{"exception", `void main(u64 m) { __asm__ volatile("ud2"); }`, nil, ErrGuestException},
		{"page fault", `void main(u64 m) { *(volatile u64 *)0x7000000000UL = 1; }`, nil, ErrGuestException},
		{"triple fault", `void main(u64 m) { __asm__ volatile("ud2"); }`, func(vm *VM) error {
			s, err := vm.VCPU(0).Sregs()
			if err != nil {
				return err
			}
			s.IDT.Limit = 0
			return vm.VCPU(0).SetSregs(s)
		}, ErrTripleFault},
	}
	var want uint64 = 1
	for i := uint64(0); i < 300000000; i++ {
		want = want*6364136223846793005 + 1442695040888963407
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prog := buildGuest(t, tc.src)
			other := newBare(t, 8<<20, busy, Config{})
			done := make(chan error, 1)
			go func() { done <- other.Run(context.Background()) }()
			bad := newBare(t, 8<<20, prog, Config{})
			if tc.setup != nil {
				if err := tc.setup(bad); err != nil {
					t.Fatal(err)
				}
			}
			err := bad.Run(context.Background())
			var ge *GuestError
			if !errors.Is(err, tc.want) || !errors.As(err, &ge) {
				t.Fatalf("Run = %v, want a GuestError wrapping %v", err, tc.want)
			}
			t.Logf("contained: %v", err)
			if err := <-done; err != nil {
				t.Fatalf("the other VM failed: %v", err)
			}
			if r := other.Reports(); len(r) != 1 || r[0] != uint32(want>>32) {
				t.Fatalf("the other VM reported %v, want [%d]", r, uint32(want>>32))
			}
		})
	}
}

// TestForkRunningVM forks a VM while its guest runs (Pause from another
// goroutine), then checks that parent and children go on independently.
func TestForkRunningVM(t *testing.T) {
	prog := buildGuest(t, `
void main(u64 memsize) {
	volatile u64 *a = (u64 *)0x800000;
	for (;;) a[0]++;
}`)
	vm := newBare(t, 16<<20, prog, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vm.Run(ctx) }()
	counter := func(v *VM) uint64 { u, _ := v.guestU64(0x800000); return u }
	for counter(vm) < 1000 {
		time.Sleep(time.Millisecond)
	}
	img, kids, err := vm.Fork(context.Background(), 2, ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	v0 := counter(kids[0])
	if v0 == 0 || counter(kids[1]) != v0 {
		t.Fatalf("children start with counters %d and %d", v0, counter(kids[1]))
	}
	kctx, kcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer kcancel()
	if err := kids[0].Run(kctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("child Run = %v, want the deadline", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("parent Run = %v, want cancellation", err)
	}
	p, k0, k1 := counter(vm), counter(kids[0]), counter(kids[1])
	t.Logf("at fork %d; parent %d, child 1 %d, child 2 (never run) %d", v0, p, k0, k1)
	if p <= v0 || k0 <= v0 {
		t.Errorf("parent (%d) or child 1 (%d) did not go on past %d", p, k0, v0)
	}
	if k1 != v0 {
		t.Errorf("child 2 sees %d, want %d: another VM's writes reached it", k1, v0)
	}
	if v, _ := readImageU64(img, 0x800000); v != v0 {
		t.Errorf("image holds %d, want %d: it was written after the seal", v, v0)
	}
	for _, k := range kids {
		k.Close()
	}
}

func readImageU64(img *Image, off int64) (uint64, error) {
	var b [8]byte
	if _, err := unix.Pread(img.Fd(), b[:], off); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

type failingSource struct {
	PageSource
	bad uint64
}

func (s failingSource) ReadPage(off uint64, buf []byte) (bool, error) {
	if off == s.bad {
		return false, errors.New("page lost")
	}
	return s.PageSource.ReadPage(off, buf)
}

// sealedReader seals a 16 MiB guest that, once forked, reports the value 9
// it finds at 0x800000 and exits.
func sealedReader(t *testing.T) *Image {
	t.Helper()
	prog := buildGuest(t, `
void main(u64 memsize) {
	volatile u64 *a = (u64 *)0x800000;
	snapshot();
	report((u32)a[0]);
	exit(0);
}`)
	var img *Image
	vm := newBare(t, 16<<20, prog, Config{OnRequest: func(ctx context.Context, vm *VM, req Request) (uint64, error) {
		var err error
		img, err = vm.Seal()
		return 0, err
	}})
	vm.Mem()[0x800000] = 9
	if err := vm.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { img.Close() })
	return img
}

// TestUserfaultSourceError checks that a page the source cannot serve ends
// the child's Run with an error instead of hanging or running on zeros.
func TestUserfaultSourceError(t *testing.T) {
	img := sealedReader(t)
	kids, err := img.Fork(context.Background(), 2, ForkOptions{Mode: ForkUserfault})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := img.Fork(context.Background(), 1, ForkOptions{Mode: ForkUserfault, Source: failingSource{imageSource{img}, 0x800000}})
	if err != nil {
		t.Fatal(err)
	}
	defer bad[0].Close()
	if err := bad[0].Run(context.Background()); err == nil || !strings.Contains(err.Error(), "page lost") {
		t.Fatalf("Run with a failing page source = %v, want the source's error", err)
	}
	for _, k := range kids {
		if err := k.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := k.Reports(); len(r) != 1 || r[0] != 9 {
			t.Errorf("child reported %v, want [9]", r)
		}
		k.Close()
	}
}
