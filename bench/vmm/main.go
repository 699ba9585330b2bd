// Command vmm benchmarks tine's VM fork: latency from the fork call to the
// child's first guest instruction, fan-out, host memory per child, and
// snapshot throughput, against two baselines measured in the same run:
// a cold start of the same bare guest, and a restore that copies the
// image instead of mapping it.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"tine/bench/internal/hostload"
	"tine/bench/internal/vmrun"
	"tine/chunkstore"
	"tine/vmm"
)

// guest is the benchmark's bare guest, hand-assembled:
//
//	mov dx, 0x501; out dx, eax      report: the child's first instruction
//	mov rdi, 0x2000000              dirty area at 32 MiB
//	loop: test rbx, rbx; jz done    RBX = pages to dirty
//	mov [rdi], bl; add rdi, 4096; dec rbx; jmp loop
//	done: mov dx, 0x504; out dx, eax  exit
var guest = []byte{
	0x66, 0xba, 0x01, 0x05, 0xef,
	0x48, 0xc7, 0xc7, 0x00, 0x00, 0x00, 0x02,
	0x48, 0x85, 0xdb, 0x74, 0x0e,
	0x88, 0x1f, 0x48, 0x81, 0xc7, 0x00, 0x10, 0x00, 0x00, 0x48, 0xff, 0xcb, 0xeb, 0xed,
	0x66, 0xba, 0x04, 0x05, 0xef, 0xeb, 0xfe,
}

const mib = 1 << 20

type options struct {
	quick      bool
	forks      int
	workingSet uint64
	sizes      []uint64
	fanouts    []int
	crowds     []int
}

func main() {
	quick := flag.Bool("quick", false, "fewer forks and sizes (about a minute)")
	forks := flag.Int("forks", 0, "forks per latency row (default 1000, 200 with -quick)")
	save := flag.String("save", "", "also write the fork latencies and fan-out as JSON to this file (bench/report --vmm reads it)")
	flag.Parse()
	o := options{quick: *quick, forks: 1000, workingSet: 64 * mib,
		sizes:   []uint64{256 * mib, 1 << 30, 4 << 30, 16 << 30},
		fanouts: []int{1, 10, 100, 1000}, crowds: []int{0, 100, 1000}}
	if o.quick {
		o.forks = 200
		o.sizes = []uint64{256 * mib, 4 << 30}
		o.fanouts = []int{1, 10, 100}
		o.crowds = []int{0, 100}
	}
	if *forks > 0 {
		o.forks = *forks
	}
	raiseNoFile()
	res := &vmrun.Run{Command: "go run ./bench/vmm " + strings.Join(os.Args[1:], " "), Started: time.Now(),
		KVM: kvmKind(), LoadStart: hostload.Average()}
	if err := run(context.Background(), o, os.Stdout, res); err != nil {
		fmt.Fprintln(os.Stderr, "bench/vmm:", err)
		os.Exit(1)
	}
	res.Seconds, res.LoadEnd = time.Since(res.Started).Seconds(), hostload.Average()
	if *save != "" {
		if err := res.Save(*save); err != nil {
			fmt.Fprintln(os.Stderr, "bench/vmm:", err)
			os.Exit(1)
		}
	}
}

// seconds returns d's samples in seconds.
func (d *dist) seconds() []float64 {
	s := make([]float64, len(d.xs))
	for i, x := range d.xs {
		s[i] = x.Seconds()
	}
	return s
}

func raiseNoFile() {
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) == nil && r.Cur < r.Max {
		r.Cur = r.Max
		unix.Setrlimit(unix.RLIMIT_NOFILE, &r)
	}
}

// parent builds a VM with the guest loaded and a working set of non-zero
// pages written, and seals it; children start at the guest's first
// instruction.
func parent(ctx context.Context, size, workingSet uint64) (*vmm.VM, *vmm.Image, error) {
	vm, err := vmm.New(ctx, vmm.Config{MemSize: size})
	if err != nil {
		return nil, nil, err
	}
	if err := vm.LoadBare(guest); err != nil {
		vm.Close()
		return nil, nil, err
	}
	fillWorkingSet(vm.Mem(), workingSet)
	img, err := vm.Seal()
	if err != nil {
		vm.Close()
		return nil, nil, err
	}
	return vm, img, nil
}

// fillWorkingSet writes distinct non-zero pages from 128 MiB on (or from
// 4 MiB when RAM is small), standing for a guest's resident memory.
func fillWorkingSet(mem []byte, n uint64) {
	start := uint64(128 * mib)
	if uint64(len(mem)) < start+n {
		start = 4 * mib
	}
	for off := start; off < start+n && off+8 <= uint64(len(mem)); off += vmm.PageSize {
		binary.LittleEndian.PutUint64(mem[off:], off|1)
	}
}

// timedConfig returns a config whose OnReport sends the time since *t0.
func timedConfig(t0 *time.Time, got chan<- time.Duration) vmm.Config {
	return vmm.Config{OnReport: func(vm *vmm.VM, v uint32) { got <- time.Since(*t0) }}
}

type dist struct{ xs []time.Duration }

func (d *dist) add(x time.Duration) { d.xs = append(d.xs, x) }
func (d *dist) q(p float64) time.Duration {
	if len(d.xs) == 0 {
		return 0
	}
	s := slices.Clone(d.xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

// forkLatency forks n children one by one, each run to its first
// instruction; with a pool, empty VMs are made ahead in batches outside
// the timed part.
func forkLatency(ctx context.Context, img *vmm.Image, n int, usePool, premap bool, mode vmm.ForkMode) (*dist, error) {
	var t0 time.Time
	got := make(chan time.Duration, 1)
	cfg := timedConfig(&t0, got)
	d := &dist{}
	warm := 20
	batch := 100
	if img.Size() > 1<<30 {
		batch = 20 // each empty VM holds memory-slot metadata in proportion to RAM
	}
	var pool *vmm.Pool
	if usePool {
		var p *vmm.Pool
		var err error
		if premap {
			p, err = vmm.NewImagePool(ctx, img, cfg, 0)
		} else {
			p, err = vmm.NewPool(ctx, poolConfig(img, cfg), 0)
		}
		if err != nil {
			return nil, err
		}
		pool = p
		defer pool.Close()
	}
	for i := -warm; i < n; i++ {
		if pool != nil && pool.Len() == 0 {
			if err := pool.Fill(ctx, min(batch, n-i+1)); err != nil {
				return nil, err
			}
		}
		t0 = time.Now()
		kids, err := img.Fork(ctx, 1, vmm.ForkOptions{Config: &cfg, Pool: pool, Mode: mode})
		if err != nil {
			return nil, err
		}
		if err := kids[0].Run(ctx); err != nil {
			return nil, err
		}
		lat := <-got
		if i >= 0 {
			d.add(lat)
		}
		kids[0].Close()
	}
	return d, nil
}

func poolConfig(img *vmm.Image, cfg vmm.Config) vmm.Config {
	cfg.MemSize = img.Size()
	cfg.VCPUs = len(img.State().VCPUs)
	cfg.IRQChip = img.State().IRQChip
	return cfg
}

// coldStart creates, loads and runs a fresh VM to its first instruction.
func coldStart(ctx context.Context, size uint64, n int) (*dist, error) {
	d := &dist{}
	for i := -5; i < n; i++ {
		var t0 time.Time
		got := make(chan time.Duration, 1)
		cfg := timedConfig(&t0, got)
		cfg.MemSize = size
		t0 = time.Now()
		vm, err := vmm.New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if err := vm.LoadBare(guest); err != nil {
			return nil, err
		}
		if err := vm.Run(ctx); err != nil {
			return nil, err
		}
		if lat := <-got; i >= 0 {
			d.add(lat)
		}
		vm.Close()
	}
	return d, nil
}

// copyRestore makes a fresh VM, copies the image's data into its RAM and
// loads the state: restore without mapping.
func copyRestore(ctx context.Context, img *vmm.Image, n int) (*dist, error) {
	d := &dist{}
	buf := make([]byte, 1*mib)
	for i := -5; i < n; i++ {
		var t0 time.Time
		got := make(chan time.Duration, 1)
		cfg := timedConfig(&t0, got)
		cfg.MemSize = img.Size()
		t0 = time.Now()
		vm, err := vmm.New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		mem := vm.Mem()
		off := int64(0)
		for off < int64(img.Size()) {
			dpos, err := unix.Seek(img.Fd(), off, unix.SEEK_DATA)
			if err != nil {
				break
			}
			hole, _ := unix.Seek(img.Fd(), dpos, unix.SEEK_HOLE)
			for p := dpos; p < hole; p += int64(len(buf)) {
				m, _ := unix.Pread(img.Fd(), buf[:min(int64(len(buf)), hole-p)], p)
				copy(mem[p:], buf[:m])
			}
			off = hole
		}
		if err := vm.RestoreState(img.State()); err != nil {
			return nil, err
		}
		if err := vm.Run(ctx); err != nil {
			return nil, err
		}
		if lat := <-got; i >= 0 {
			d.add(lat)
		}
		vm.Close()
	}
	return d, nil
}

// fanOut forks n children at once from a full pool and runs them all;
// it returns the time from the fork call until the last child's first
// instruction.
func fanOut(ctx context.Context, img *vmm.Image, n int) (time.Duration, time.Duration, error) {
	var t0 time.Time
	got := make(chan time.Duration, n)
	cfg := timedConfig(&t0, got)
	pool, err := vmm.NewImagePool(ctx, img, cfg, n)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	t0 = time.Now()
	kids, err := img.Fork(ctx, n, vmm.ForkOptions{Config: &cfg, Pool: pool})
	if err != nil {
		return 0, 0, err
	}
	forked := time.Since(t0)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, k := range kids {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- k.Run(ctx) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, 0, err
		}
	}
	var last time.Duration
	for range n {
		last = max(last, <-got)
	}
	for _, k := range kids {
		k.Close()
	}
	return forked, last, nil
}

// smapsMapping returns Rss, Pss and Private (KiB) of the mapping starting
// at addr in /proc/self/smaps.
func smapsMapping(addr uintptr) (rss, pss, private int, err error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	prefix := strconv.FormatUint(uint64(addr), 16) + "-"
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			if in {
				return
			}
			in = strings.HasPrefix(line, prefix)
			continue
		}
		if !in {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		case "Private_Clean:", "Private_Dirty:":
			private += v
		}
	}
	return rss, pss, private, sc.Err()
}

// rollup returns Pss and Private (KiB) of this process.
func rollup() (pss, private int) {
	b, err := os.ReadFile("/proc/self/smaps_rollup")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Pss:":
			pss = v
		case "Private_Clean:", "Private_Dirty:":
			private += v
		}
	}
	return
}

type memRow struct {
	dirty                int
	rss, pss, private    float64 // KiB per child, guest RAM mapping
	procPss, procPrivate float64 // KiB per child, whole process delta
	hostDrop             float64 // KiB per child, drop of MemAvailable
}

// memAvailable returns MemAvailable from /proc/meminfo in KiB.
func memAvailable() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
			v, _ := strconv.Atoi(f[1])
			return v
		}
	}
	return 0
}

// memoryPerChild forks n idle children that each dirty k pages, and
// measures their guest-RAM mappings and the process's growth.
func memoryPerChild(ctx context.Context, img *vmm.Image, n, k int) (memRow, error) {
	debug.FreeOSMemory()
	pss0, priv0 := rollup()
	avail0 := memAvailable()
	kids, err := img.Fork(ctx, n, vmm.ForkOptions{})
	if err != nil {
		return memRow{}, err
	}
	defer func() {
		for _, c := range kids {
			c.Close()
		}
	}()
	for _, c := range kids {
		r, err := c.VCPU(0).Regs()
		if err != nil {
			return memRow{}, err
		}
		r.RBX = uint64(k)
		if err := c.VCPU(0).SetRegs(r); err != nil {
			return memRow{}, err
		}
		if err := c.Run(ctx); err != nil {
			return memRow{}, err
		}
	}
	debug.FreeOSMemory()
	pss1, priv1 := rollup()
	row := memRow{dirty: k, procPss: float64(pss1-pss0) / float64(n), procPrivate: float64(priv1-priv0) / float64(n),
		hostDrop: float64(avail0-memAvailable()) / float64(n)}
	for _, c := range kids {
		rss, pss, private, err := smapsMapping(uintptr(unsafe.Pointer(unsafe.SliceData(c.Mem()))))
		if err != nil {
			return memRow{}, err
		}
		row.rss += float64(rss)
		row.pss += float64(pss)
		row.private += float64(private)
	}
	row.rss /= float64(n)
	row.pss /= float64(n)
	row.private /= float64(n)
	return row, nil
}

// snapshotCost measures a full snapshot of the parent image's working set
// and incremental snapshots after dirtying k pages.
func snapshotCost(ctx context.Context, size, workingSet uint64, dirties []int, w io.Writer) error {
	dir, err := os.MkdirTemp("", "tine-bench-vmm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	store, err := chunkstore.Open(dir, nil)
	if err != nil {
		return err
	}
	defer store.Close()
	vm, err := vmm.New(ctx, vmm.Config{MemSize: size, DirtyLog: true})
	if err != nil {
		return err
	}
	defer vm.Close()
	if err := vm.LoadBare(guest); err != nil {
		return err
	}
	fillWorkingSet(vm.Mem(), workingSet)
	_, st, err := vm.Snapshot(ctx, store)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "| full | %d | %d | %s | %.0f MiB/s |\n", st.PagesHashed, st.PagesStored, ms(st.Duration),
		float64(st.PagesHashed*vmm.PageSize)/mib/st.Duration.Seconds())
	for _, k := range dirties {
		// The guest dirties k pages, then the snapshot hashes only those.
		r, err := vm.VCPU(0).Regs()
		if err != nil {
			return err
		}
		r.RIP, r.RBX = vmm.BareEntry, uint64(k)
		if err := vm.VCPU(0).SetRegs(r); err != nil {
			return err
		}
		if err := vm.Run(ctx); err != nil {
			return err
		}
		_, st, err := vm.Snapshot(ctx, store)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "| incremental, %d dirtied | %d | %d | %s | %.1f µs/page |\n", k, st.PagesHashed, st.PagesStored, ms(st.Duration),
			float64(st.Duration.Microseconds())/float64(max(1, st.PagesHashed)))
	}
	return nil
}

// run runs every benchmark, writes its tables to w and keeps the fork
// latencies and fan-out in res.
func run(ctx context.Context, o options, w io.Writer, res *vmrun.Run) error {
	fmt.Fprintf(w, "# bench/vmm (KVM on this host: %s; %d CPUs; load average at start %s; %d forks per row after warm-up)\n\n",
		kvmKind(), runtime.NumCPU(), hostload.Average(), o.forks)

	if err := linuxFork(ctx, o, w); err != nil {
		return fmt.Errorf("linux fork: %w", err)
	}

	// Latency against RAM size, with the two baselines at 256 MiB.
	fmt.Fprintln(w, "## Fork to first guest instruction (working set 64 MiB)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Ratios are baseline p50 / row p50 at the same RAM size (higher is better).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| RAM | method | p50 | p99 | vs cold start | vs copying restore |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, size := range o.sizes {
		vm, img, err := parent(ctx, size, o.workingSet)
		if err != nil {
			return err
		}
		cold, err := coldStart(ctx, size, max(10, o.forks/10))
		if err != nil {
			return err
		}
		cp, err := copyRestore(ctx, img, max(5, o.forks/50))
		if err != nil {
			return err
		}
		line := func(name string, d *dist) {
			res.Forks = append(res.Forks, vmrun.Fork{RAM: size, Method: name, Baseline: d == cold || d == cp, Samples: d.seconds()})
			fmt.Fprintf(w, "| %s | %s | %s | %s | %.1fx | %.1fx |\n", human(size), name, ms(d.q(0.5)), ms(d.q(0.99)),
				float64(cold.q(0.5))/float64(d.q(0.5)), float64(cp.q(0.5))/float64(d.q(0.5)))
		}
		rows := []struct {
			name         string
			pool, premap bool
			mode         vmm.ForkMode
			count        int
		}{
			{"fork, MAP_PRIVATE, warm pool with the image mapped", true, true, vmm.ForkMapPrivate, o.forks},
			{"fork, MAP_PRIVATE, warm pool, image mapped at fork", true, false, vmm.ForkMapPrivate, o.forks / 2},
			{"fork, MAP_PRIVATE, VM made at fork", false, false, vmm.ForkMapPrivate, o.forks / 4},
			{"fork, userfaultfd, warm pool", true, false, vmm.ForkUserfault, o.forks / 4},
		}
		for _, r := range rows {
			d, err := forkLatency(ctx, img, r.count, r.pool, r.premap, r.mode)
			if err != nil {
				return fmt.Errorf("%s at %d MiB: %w", r.name, size/mib, err)
			}
			line(r.name, d)
		}
		line("baseline: cold start (New + LoadBare + run)", cold)
		line("baseline: restore by copying the image", cp)
		img.Close()
		vm.Close()
	}

	_, img, err := parent(ctx, o.sizes[0], o.workingSet)
	if err != nil {
		return err
	}
	defer img.Close()

	fmt.Fprintf(w, "\n## Fan-out (%s RAM, warm pool filled before the clock starts)\n\n", human(o.sizes[0]))
	fmt.Fprintln(w, "| children | all forked | all at first instruction | per child |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, n := range o.fanouts {
		forked, last, err := fanOut(ctx, img, n)
		if err != nil {
			return fmt.Errorf("fan-out %d: %w", n, err)
		}
		res.FanOut = append(res.FanOut, vmrun.FanOut{Children: n, Forked: forked.Seconds(), Answered: last.Seconds()})
		fmt.Fprintf(w, "| %d | %s | %s | %s |\n", n, ms(forked), ms(last), ms(last/time.Duration(n)))
	}

	fmt.Fprintf(w, "\n## Fork latency against VMs in the same process (%s RAM, warm image pool)\n\n", human(o.sizes[0]))
	fmt.Fprintln(w, "Every VM registers an MMU notifier on the process's address space, so each")
	fmt.Fprintln(w, "mapping change (mapping an image, closing a child) calls every VM's notifier.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| other idle VMs in the process | p50 | p99 |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, k := range o.crowds {
		crowd, err := vmm.NewImagePool(ctx, img, vmm.Config{}, k)
		if err != nil {
			return fmt.Errorf("crowd of %d VMs: %w", k, err)
		}
		d, err := forkLatency(ctx, img, o.forks/4, true, true, vmm.ForkMapPrivate)
		crowd.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "| %d | %s | %s |\n", k, ms(d.q(0.5)), ms(d.q(0.99)))
	}

	fmt.Fprintf(w, "\n## Host memory per child (%s RAM, 64 MiB working set in the image; KiB)\n\n", human(o.sizes[0]))
	fmt.Fprintln(w, "| pages dirtied | RAM mapping Rss | RAM mapping Pss | RAM mapping Private | process Pss growth | process Private growth | host MemAvailable drop (system-wide, noisy) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	nMem := 100
	if _, err := memoryPerChild(ctx, img, nMem, 0); err != nil { // settles the heap
		return err
	}
	for _, k := range []int{0, 1, 100, 10000} {
		row, err := memoryPerChild(ctx, img, nMem, k)
		if err != nil {
			return fmt.Errorf("memory with %d dirty pages: %w", k, err)
		}
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", k, row.rss, row.pss, row.private, row.procPss, row.procPrivate, row.hostDrop)
	}

	fmt.Fprintf(w, "\n## Snapshot to the chunk store (%s RAM, 64 MiB working set)\n\n", human(o.sizes[0]))
	fmt.Fprintln(w, "| snapshot | pages hashed | pages stored | time | rate |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	return snapshotCost(ctx, o.sizes[0], o.workingSet, []int{1, 100, 10000}, w)
}

func human(b uint64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%d GiB", b>>30)
	}
	return fmt.Sprintf("%d MiB", b>>20)
}

func kvmKind() string {
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "PVM"
	}
	if _, err := os.Stat("/sys/module/kvm_intel"); err == nil {
		return "VMX"
	}
	if _, err := os.Stat("/sys/module/kvm_amd"); err == nil {
		return "SVM"
	}
	return "unknown"
}
