package vmm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// forkBombGuest forks forever: every VM, children included, asks for
// more children until the VMM refuses; then it reports how many forks it
// got and what the refusal put in RAX, and exits.
const forkBombGuest = `
void main(u64 memsize) {
	u32 got = 0;
	if (fork(0xffffffffU) != (u64)-1) exit(9);
	for (;;) {
		u64 r = fork(FANOUT);
		if (r == (u64)-1) { report(got); exit(0); }
		if (r == 0) got++; else got = 0;
	}
}`

// threads returns the process's OS thread count.
func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// TestForkBombBounded runs a guest that forks forks of 64 children, each
// VM run at once on its own goroutine, for a few seconds with the default
// limits: the family never passes DefaultMaxVMs live VMs, the process's
// threads stay far below Go's 10000-thread limit, and the guests get
// RequestRefused instead of the host crashing.
func TestForkBombBounded(t *testing.T) {
	prog := buildGuest(t, strings.Replace(forkBombGuest, "FANOUT", "64", 1))
	needKVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var (
		wg                          sync.WaitGroup
		live, maxLive, made, refuse atomic.Int64
		maxThreads                  atomic.Int64
		mu                          sync.Mutex
		errs                        []error
	)
	var start func(vm *VM)
	cfg := Config{
		OnRefused: func(vm *VM, req Request, err error) { refuse.Add(1) },
	}
	cfg.OnRequest = func(ctx context.Context, vm *VM, req Request) (uint64, error) {
		img, kids, err := vm.Fork(ctx, int(req.Arg), ForkOptions{IndexInRAX: true})
		if err != nil {
			return 0, err
		}
		img.Close()
		made.Add(int64(len(kids)))
		for _, k := range kids {
			start(k)
		}
		return 0, nil
	}
	start = func(vm *VM) {
		if n := live.Add(1); n > maxLive.Load() {
			maxLive.Store(n)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer live.Add(-1)
			defer vm.Close()
			if n := int64(threads(t)); n > maxThreads.Load() {
				maxThreads.Store(n)
			}
			err := vm.Run(ctx)
			if err != nil && ctx.Err() == nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			if err == nil && vm.ExitCode() != 0 {
				mu.Lock()
				errs = append(errs, errors.New("a guest's fork of 0xffffffff children was not refused"))
				mu.Unlock()
			}
		}()
	}
	cfg.MemSize = 4 << 20
	root, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := root.LoadBare(prog); err != nil {
		root.Close()
		t.Fatal(err)
	}
	start(root)
	<-ctx.Done()
	wg.Wait()
	t.Logf("%d VMs made, at most %d live, %d requests refused, at most %d threads", made.Load(), maxLive.Load(), refuse.Load(), maxThreads.Load())
	for _, err := range errs {
		t.Error(err)
	}
	if maxLive.Load() > DefaultMaxVMs {
		t.Errorf("%d VMs were live at once, the limit is %d", maxLive.Load(), DefaultMaxVMs)
	}
	if refuse.Load() == 0 {
		t.Error("no fork request was refused")
	}
	if maxThreads.Load() > 2*DefaultMaxVMs {
		t.Errorf("%d threads, want at most %d", maxThreads.Load(), 2*DefaultMaxVMs)
	}
	if n := liveVCPUs.Load(); n != 0 {
		t.Errorf("%d vCPUs still counted live after every VM closed", n)
	}
}

// TestForkLimits runs the fork bomb with small limits, one VM at a time:
// the guest sees RequestRefused, the host is told why (count and depth),
// and no VM passes the depth limit.
func TestForkLimits(t *testing.T) {
	prog := buildGuest(t, strings.Replace(forkBombGuest, "FANOUT", "3", 1))
	var queue []*VM
	var reasons []string
	maxLive := 0
	cfg := Config{MemSize: 4 << 20, Limits: Limits{MaxVMs: 10, MaxDepth: 3}}
	cfg.OnRefused = func(vm *VM, req Request, err error) {
		if !errors.Is(err, ErrLimit) {
			t.Errorf("refused with %v, want ErrLimit", err)
		}
		reasons = append(reasons, err.Error())
	}
	cfg.OnRequest = func(ctx context.Context, vm *VM, req Request) (uint64, error) {
		img, kids, err := vm.Fork(ctx, int(req.Arg), ForkOptions{IndexInRAX: true})
		if err != nil {
			return 0, err
		}
		img.Close()
		for _, k := range kids {
			if k.depth > 3 {
				t.Errorf("a VM at depth %d, the limit is 3", k.depth)
			}
		}
		queue = append(queue, kids...)
		maxLive = max(maxLive, len(queue)+1)
		return 0, nil
	}
	vm := newBare(t, 4<<20, prog, cfg)
	ran := 0
	for {
		if err := vm.Run(context.Background()); err != nil {
			t.Fatalf("VM %d: %v", vm.Index(), err)
		}
		if vm.ExitCode() != 0 {
			t.Fatalf("VM %d: its fork of 0xffffffff children was not refused", vm.Index())
		}
		ran++
		vm.Close()
		if len(queue) == 0 {
			break
		}
		vm, queue = queue[0], queue[1:]
	}
	all := strings.Join(reasons, "\n")
	t.Logf("%d VMs ran, at most %d live, %d refusals", ran, maxLive, len(reasons))
	if maxLive > 10 {
		t.Errorf("%d VMs live at once, the limit is 10", maxLive)
	}
	for _, want := range []string{"fork of 4294967295 children", "generations", "live VMs"} {
		if !strings.Contains(all, want) {
			t.Errorf("no refusal says %q:\n%s", want, all)
		}
	}
}

// TestProcessVCPULimit checks that a VM beyond the process's vCPU
// allowance is refused with ErrLimit, and that closing VMs gives it back.
func TestProcessVCPULimit(t *testing.T) {
	needKVM(t)
	SetMaxVCPUs(2)
	defer SetMaxVCPUs(DefaultMaxVCPUs)
	a, err := New(context.Background(), Config{MemSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := New(context.Background(), Config{MemSize: 2 << 20, VCPUs: 2}); !errors.Is(err, ErrLimit) {
		t.Fatalf("New of 2 more vCPUs = %v, want ErrLimit", err)
	}
	b, err := New(context.Background(), Config{MemSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	img, err := b.Seal()
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if _, err := img.Fork(context.Background(), 1, ForkOptions{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("Fork past the allowance = %v, want ErrLimit", err)
	}
	if _, err := img.Fork(context.Background(), 1<<30, ForkOptions{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("Fork of 2^30 children = %v, want ErrLimit", err)
	}
	b.Close()
	kids, err := img.Fork(context.Background(), 1, ForkOptions{})
	if err != nil {
		t.Fatalf("Fork after a VM closed: %v", err)
	}
	kids[0].Close()
}

// TestReportFlood runs a guest that reports 20000 values in a tight loop:
// the VM keeps only the newest MaxReports, in order, counts the rest as
// dropped, and the heap does not grow with the number of reports.
func TestReportFlood(t *testing.T) {
	const n, keep = 20000, 512
	prog := buildGuest(t, `
void main(u64 m) {
	for (u32 i = 0; i < 20000; i++) report(i);
	exit(0);
}`)
	vm := newBare(t, 4<<20, prog, Config{MaxReports: keep})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	if err := vm.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	r, dropped := vm.Reports(), vm.ReportsDropped()
	t.Logf("%d reports in %v (%.0f a second); heap %d -> %d bytes", n, took.Round(time.Millisecond), n/took.Seconds(), before.HeapAlloc, after.HeapAlloc)
	if len(r) != keep || dropped != n-keep {
		t.Fatalf("kept %d and dropped %d of %d reports, want %d kept", len(r), dropped, n, keep)
	}
	for i, v := range r {
		if v != uint32(n-keep+i) {
			t.Fatalf("kept report %d is %d, want %d: not the newest in order", i, v, n-keep+i)
		}
	}
	if cap(vm.reports.buf) > keep {
		t.Errorf("report buffer holds %d values", cap(vm.reports.buf))
	}
	if grow := int64(after.HeapAlloc) - int64(before.HeapAlloc); grow > 1<<20 {
		t.Errorf("heap grew by %d bytes", grow)
	}
	if maxReports(Config{}) != DefaultMaxReports {
		t.Errorf("default MaxReports is %d", maxReports(Config{}))
	}
}

// snapshotLoopGuest asks for a snapshot in a tight loop, dirtying a page
// before each, and reports how many were taken and refused.
const snapshotLoopGuest = `
void main(u64 m) {
	volatile u64 *a = (u64 *)0x400000;
	u32 ok = 0, refused = 0;
	for (u32 i = 0; i < 1000; i++) {
		a[(i % 256) * 512] = i + 1;
		if (snapshot() == (u64)-1) refused++; else ok++;
	}
	report(ok);
	report(refused);
	exit(0);
}`

func dirSize(t *testing.T, dir string) int64 {
	var n int64
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSnapshotRequestsLimited runs guests that ask for snapshots in a tight
// loop: with an interval, at most one per interval is taken; with a byte
// budget, snapshots stop once it is spent and the store stays near it.
func TestSnapshotRequestsLimited(t *testing.T) {
	prog := buildGuest(t, snapshotLoopGuest)
	cases := []struct {
		name   string
		limits Limits
	}{
		{"interval", Limits{SnapshotInterval: 50 * time.Millisecond, SnapshotBurst: 4}},
		{"bytes", Limits{SnapshotInterval: time.Nanosecond, MaxSnapshotBytes: 2 << 20}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			store := openStore(t, dir)
			defer store.Close()
			var refusals atomic.Int64
			taken := 0
			cfg := Config{Limits: tc.limits, DirtyLog: true,
				OnRefused: func(*VM, Request, error) { refusals.Add(1) },
				OnRequest: func(ctx context.Context, vm *VM, req Request) (uint64, error) {
					_, _, err := vm.Snapshot(ctx, store)
					taken++
					return 0, err
				}}
			vm := newBare(t, 8<<20, prog, cfg)
			start := time.Now()
			if err := vm.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			r := vm.Reports()
			size := dirSize(t, dir)
			t.Logf("%d snapshots taken, %d refused in %v; store %d bytes", r[0], r[1], took.Round(time.Millisecond), size)
			if len(r) != 2 || int(r[0]) != taken || r[0]+r[1] != 1000 || int64(r[1]) != refusals.Load() {
				t.Fatalf("guest reported %v, host took %d and refused %d", r, taken, refusals.Load())
			}
			switch tc.name {
			case "interval":
				if limit := int(took/tc.limits.SnapshotInterval) + tc.limits.SnapshotBurst; taken > limit {
					t.Errorf("%d snapshots in %v, want at most %d", taken, took, limit)
				}
			case "bytes":
				if r[1] == 0 {
					t.Error("no snapshot was refused once the bytes were spent")
				}
				if size > 4<<20 {
					t.Errorf("store holds %d bytes, the family's budget is 2 MiB", size)
				}
			}
		})
	}
}

// remapSource serves pages from the image, except that serving page bad
// first maps fresh memory over it in the VM's RAM: the userfaultfd then
// refuses to fill it (ENOENT), a fill failure as a broken source causes.
type remapSource struct {
	PageSource
	mem []byte
	bad uint64
}

func (s remapSource) ReadPage(off uint64, buf []byte) (bool, error) {
	if off == s.bad {
		if _, err := unix.MmapPtr(-1, 0, unsafePointer(s.mem[off:]), PageSize,
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED); err != nil {
			return false, err
		}
	}
	return s.PageSource.ReadPage(off, buf)
}

// TestUserfaultFillFailure checks that a page the handler fails to map
// ends Run with an error naming the page, without the vCPU hanging on it,
// and that the host can still read the VM's RAM afterwards.
func TestUserfaultFillFailure(t *testing.T) {
	img := sealedReader(t)
	child, err := newVM(context.Background(), img.cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool := &Pool{cfg: child.cfg, vms: []*VM{child}}
	kids, err := img.Fork(context.Background(), 1, ForkOptions{Pool: pool, Mode: ForkUserfault,
		Source: remapSource{imageSource{img}, child.Mem(), 0x800000}})
	if err != nil {
		t.Fatal(err)
	}
	defer kids[0].Close()
	done := make(chan error, 1)
	go func() { done <- kids[0].Run(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run still blocked 20 s after the page fill failed: the vCPU hangs")
	}
	if err == nil || !strings.Contains(err.Error(), "serve guest page at 0x800000") {
		t.Fatalf("Run = %v, want the fill error naming page 0x800000", err)
	}
	t.Logf("Run: %v", err)
	if err := kids[0].Run(context.Background()); err == nil {
		t.Error("a second Run of the failed VM succeeded")
	}
	if _, err := kids[0].Seal(); err == nil {
		t.Error("a failed VM with incomplete RAM was sealed")
	}
	read := make(chan byte, 1)
	go func() { read <- kids[0].Mem()[0x900000] }()
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("reading an unserved page of the failed VM hangs")
	}
}

// TestFamilyAdmitFork checks the family's fork admission, also once the
// host itself made more VMs than the limit allows a guest.
func TestFamilyAdmitFork(t *testing.T) {
	f := newFamily(Limits{MaxVMs: 4, MaxDepth: 2})
	f.join()
	if err := f.admitFork(0, 3); err != nil {
		t.Fatalf("fork of 3 with 1 of 4 live: %v", err)
	}
	if err := f.admitFork(0, 1); !errors.Is(err, ErrLimit) {
		t.Errorf("fork of 1 with 1 live and 3 reserved of 4 = %v, want ErrLimit", err)
	}
	f.release(3)
	if err := f.admitFork(2, 1); !errors.Is(err, ErrLimit) {
		t.Errorf("fork at depth 2 of 2 = %v, want ErrLimit", err)
	}
	for range 9 {
		f.join() // the host forked past the limit
	}
	for _, n := range []uint32{1, 0xffffffff} {
		if err := f.admitFork(0, n); !errors.Is(err, ErrLimit) {
			t.Errorf("fork of %d with 10 of 4 live = %v, want ErrLimit", n, err)
		}
	}
}

// TestFamilyAdmitSnapshot checks the snapshot rate (burst, then one per
// interval) and the byte budget.
func TestFamilyAdmitSnapshot(t *testing.T) {
	f := newFamily(Limits{SnapshotInterval: time.Second, SnapshotBurst: 2, MaxSnapshotBytes: 100})
	now := time.Unix(1000, 0)
	for i, want := range []bool{true, true, false} {
		if err := f.admitSnapshot(now); (err == nil) != want {
			t.Fatalf("request %d at once: %v", i, err)
		}
	}
	if err := f.admitSnapshot(now.Add(500 * time.Millisecond)); err == nil {
		t.Error("a request half an interval later was admitted")
	}
	if err := f.admitSnapshot(now.Add(1100 * time.Millisecond)); err != nil {
		t.Errorf("a request an interval later: %v", err)
	}
	f.chargeSnapshot(100)
	if err := f.admitSnapshot(now.Add(time.Hour)); !errors.Is(err, ErrLimit) {
		t.Errorf("a request once the bytes were spent = %v, want ErrLimit", err)
	}
}
