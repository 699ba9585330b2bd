package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"tine/chunkstore"
	"tine/vmm"
)

// vmOpts holds the flags of the vm commands.
type vmOpts struct {
	mem, storeDir, ref      string
	lazy, pool              bool
	n                       int
	kernel, initrd, cmdline string
	cpus                    int
	input                   bool
}

// vmCommand is the "tine vm" family: the virtual machine monitor on its own.
func (a *app) vmCommand() *cobra.Command {
	g := group("vm", "the virtual machine monitor on its own: bare guests, snapshots, Linux boots")
	cmd := func(use, short string, args cobra.PositionalArgs, run func(context.Context, *vmOpts, []string, io.Writer) error, flags func(*pflag.FlagSet, *vmOpts)) *cobra.Command {
		o := &vmOpts{}
		c := &cobra.Command{Use: use, Short: short, Args: args, RunE: func(c *cobra.Command, args []string) error {
			return run(c.Context(), o, args, a.stdout)
		}}
		flags(c.Flags(), o)
		return c
	}
	g.AddCommand(
		cmd("run [PROGRAM]", "run a bare guest program (built-in demo when none is given)", rangeArgs(0, 1, "at most one program file"), runVMRun,
			func(fs *pflag.FlagSet, o *vmOpts) {
				fs.StringVar(&o.mem, "mem", "64M", "guest RAM size")
				fs.StringVar(&o.storeDir, "store", "", "chunk store for the guest's snapshot requests")
				fs.StringVar(&o.ref, "ref", "", "ref to point at the latest snapshot")
			}),
		cmd("restore [ROOTID]", "resume a VM snapshot from a store and run it to the end", rangeArgs(0, 1, "--ref or one root id"), runVMRestore,
			func(fs *pflag.FlagSet, o *vmOpts) {
				fs.StringVar(&o.storeDir, "store", "", "chunk store holding the snapshot (required)")
				fs.StringVar(&o.ref, "ref", "", "ref naming the snapshot (instead of a root id argument)")
				fs.BoolVar(&o.lazy, "lazy", false, "fill guest pages from the store on first touch (userfaultfd)")
			}),
		cmd("forkbench", "measure fork to first guest instruction", nArgs(), runVMForkBench,
			func(fs *pflag.FlagSet, o *vmOpts) {
				fs.StringVar(&o.mem, "mem", "256M", "guest RAM size")
				fs.IntVarP(&o.n, "forks", "n", 200, "forks to time")
				fs.BoolVar(&o.pool, "pool", true, "fork into empty VMs made ahead")
			}),
		cmd("boot", "boot a Linux kernel with its serial console on stdout", nArgs(), runVMBoot,
			func(fs *pflag.FlagSet, o *vmOpts) {
				fs.StringVar(&o.kernel, "kernel", "", "kernel: a bzImage, or an uncompressed vmlinux booted through PVH (required)")
				fs.StringVar(&o.initrd, "initrd", "", "initial ramdisk")
				fs.StringVar(&o.cmdline, "cmdline", "console=ttyS0 panic=-1", "kernel command line")
				fs.StringVar(&o.mem, "mem", "512M", "guest RAM, with an optional K, M or G suffix (at most 3G)")
				fs.IntVar(&o.cpus, "cpus", 1, "number of vCPUs")
				fs.BoolVar(&o.input, "input", false, "forward standard input to the guest's serial port")
			}),
	)
	return g
}

// demoGuest is a hand-assembled bare guest: it prints a greeting, asks
// for a snapshot, forks into 3 children, and each VM (parent 0, children
// 1-3) prints its index before exiting.
var demoGuest = append([]byte{
	0x48, 0x8d, 0x35, 0x2e, 0x00, 0x00, 0x00, // lea rsi, [rip+msg]
	0x66, 0xba, 0x00, 0x05, // mov dx, PortConsole
	0xac,       // loop: lodsb
	0x84, 0xc0, // test al, al
	0x74, 0x03, // jz done
	0xee,       // out dx, al
	0xeb, 0xf8, // jmp loop
	0x66, 0xba, 0x02, 0x05, 0xef, // done: out PortSnapshot
	0x66, 0xba, 0x03, 0x05, 0xb8, 0x03, 0x00, 0x00, 0x00, 0xef, // out PortFork, 3
	0x04, 0x30, // add al, '0'
	0x66, 0xba, 0x00, 0x05, 0xee, // out PortConsole, al
	0xb0, 0x0a, 0xee, // out PortConsole, '\n'
	0x66, 0xba, 0x04, 0x05, 0x31, 0xc0, 0xef, // out PortExit, 0
	0xeb, 0xfe, // jmp $
}, "hello from a tine bare guest\n\x00"...)

// parseMemSize parses guest RAM sizes like 256M, 1G, 4096.
func parseMemSize(s string) (uint64, error) {
	n, err := parseSize(s)
	if err != nil || n == 0 {
		return 0, usageErr("bad size %q", s)
	}
	return uint64(n), nil
}

// vmSession runs VMs, handling snapshot and fork requests: snapshots go
// to the store (and the ref, when set); children run after their parent.
// The family's vmm.Limits (defaults) bound what the guests may ask for.
type vmSession struct {
	stdout io.Writer
	store  *chunkstore.Store
	ref    string
	queue  []*vmm.VM
}

func (s *vmSession) config() vmm.Config {
	return vmm.Config{Console: s.stdout, OnRequest: s.onRequest, OnRefused: s.onRefused}
}

func (s *vmSession) onRefused(vm *vmm.VM, req vmm.Request, err error) {
	fmt.Fprintf(s.stdout, "VM %d: request refused: %v\n", vm.Index(), err)
}

func (s *vmSession) onRequest(ctx context.Context, vm *vmm.VM, req vmm.Request) (uint64, error) {
	switch req.Kind {
	case vmm.RequestSnapshot:
		if s.store == nil {
			return 0, nil
		}
		root, st, err := vm.Snapshot(ctx, s.store)
		if err != nil {
			return 0, err
		}
		if s.ref != "" {
			old, _ := s.store.GetRef(s.ref)
			if err := s.store.SetRef(s.ref, old, root); err != nil {
				return 0, err
			}
		}
		fmt.Fprintf(s.stdout, "snapshot %s (%d pages stored, %s)\n", root, st.PagesStored, st.Duration.Round(time.Microsecond))
		return 0, nil
	case vmm.RequestFork:
		n := req.Arg
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("fork of %d children, allowed 1 to 64 at once: %w", n, vmm.ErrLimit)
		}
		cfg := s.config()
		img, kids, err := vm.Fork(ctx, int(n), vmm.ForkOptions{IndexInRAX: true, Config: &cfg})
		if err != nil {
			return 0, err
		}
		// The children and the parent hold the image's memory; the
		// session need not.
		img.Close()
		s.queue = append(s.queue, kids...)
		return 0, nil
	}
	return 0, fmt.Errorf("unknown request %d", req.Kind)
}

// runAll runs vm, then every child it (or they) forked.
func (s *vmSession) runAll(ctx context.Context, vm *vmm.VM) error {
	defer func() {
		for _, v := range s.queue {
			v.Close()
		}
	}()
	for {
		if err := vm.Run(ctx); err != nil {
			vm.Close()
			return err
		}
		if code := vm.ExitCode(); code != 0 {
			fmt.Fprintf(s.stdout, "VM %d exited with code %d\n", vm.Index(), code)
		}
		vm.Close()
		if len(s.queue) == 0 {
			return nil
		}
		vm, s.queue = s.queue[0], s.queue[1:]
	}
}

// noNewPrivs sets PR_SET_NO_NEW_PRIVS on the process, which the vm
// commands own: nothing it executes can gain privileges (ADR 0024).
func noNewPrivs() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_NO_NEW_PRIVS: %w", err)
	}
	return nil
}

func openSessionStore(dir string) (*chunkstore.Store, error) {
	if dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return chunkstore.Open(dir, nil)
}

func runVMRun(ctx context.Context, o *vmOpts, args []string, stdout io.Writer) error {
	size, err := parseMemSize(o.mem)
	if err != nil {
		return err
	}
	if err := noNewPrivs(); err != nil {
		return err
	}
	prog := demoGuest
	if len(args) == 1 {
		prog, err = os.ReadFile(args[0])
		if err != nil {
			return err
		}
	}
	store, err := openSessionStore(o.storeDir)
	if err != nil {
		return err
	}
	if store != nil {
		defer store.Close()
	}
	s := &vmSession{stdout: stdout, store: store, ref: o.ref}
	cfg := s.config()
	cfg.MemSize = size
	vm, err := vmm.New(ctx, cfg)
	if err != nil {
		return err
	}
	if err := vm.LoadBare(prog); err != nil {
		vm.Close()
		return err
	}
	return s.runAll(ctx, vm)
}

func runVMRestore(ctx context.Context, o *vmOpts, args []string, stdout io.Writer) error {
	if o.storeDir == "" {
		return usageErr("vm restore needs --store")
	}
	if err := noNewPrivs(); err != nil {
		return err
	}
	store, err := openStore(o.storeDir, nil)
	if err != nil {
		return err
	}
	defer store.Close()
	var root chunkstore.ID
	switch {
	case o.ref != "" && len(args) == 0:
		root, err = store.GetRef(o.ref)
	case o.ref == "" && len(args) == 1:
		root, err = chunkstore.ParseID(args[0])
	default:
		return usageErr("vm restore takes either --ref or one root id")
	}
	if err != nil {
		return err
	}
	s := &vmSession{stdout: stdout}
	cfg := s.config()
	var img *vmm.Image
	opts := vmm.ForkOptions{Config: &cfg}
	if o.lazy {
		img, err = vmm.OpenSnapshotLazy(store, root, cfg)
		opts.Mode = vmm.ForkUserfault
	} else {
		img, err = vmm.LoadSnapshot(ctx, store, root, cfg)
	}
	if err != nil {
		return err
	}
	defer img.Close()
	kids, err := img.Fork(ctx, 1, opts)
	if err != nil {
		return err
	}
	return s.runAll(ctx, kids[0])
}

func runVMForkBench(ctx context.Context, o *vmOpts, args []string, stdout io.Writer) error {
	mem, n, pool := &o.mem, &o.n, &o.pool
	size, err := parseMemSize(*mem)
	if err != nil {
		return err
	}
	if *n < 1 {
		return usageErr("--forks (-n) must be at least 1")
	}
	// The guest reports on its first instruction, then exits.
	guest := []byte{0x66, 0xba, 0x01, 0x05, 0xef, 0x66, 0xba, 0x04, 0x05, 0x31, 0xc0, 0xef, 0xeb, 0xfe}
	parent, err := vmm.New(ctx, vmm.Config{MemSize: size})
	if err != nil {
		return err
	}
	defer parent.Close()
	if err := parent.LoadBare(guest); err != nil {
		return err
	}
	img, err := parent.Seal()
	if err != nil {
		return err
	}
	defer img.Close()
	var t0 time.Time
	first := make(chan time.Duration, 1)
	cfg := vmm.Config{MemSize: size, OnReport: func(*vmm.VM, uint32) { first <- time.Since(t0) }}
	// Pools are refilled in small batches outside the timed part: every
	// VM in a process is notified of every mapping change in it, so a
	// fork slows down as VMs pile up in one process.
	const batch = 50
	var p *vmm.Pool
	if *pool {
		if p, err = vmm.NewImagePool(ctx, img, cfg, 0); err != nil {
			return err
		}
		defer p.Close()
	}
	lat := make([]time.Duration, 0, *n)
	for range *n {
		if p != nil && p.Len() == 0 {
			if err := p.Fill(ctx, batch); err != nil {
				return err
			}
		}
		t0 = time.Now()
		kids, err := img.Fork(ctx, 1, vmm.ForkOptions{Config: &cfg, Pool: p})
		if err != nil {
			return err
		}
		err = kids[0].Run(ctx)
		kids[0].Close()
		if err != nil {
			return err
		}
		lat = append(lat, <-first)
	}
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[min(len(lat)-1, int(f*float64(len(lat))))] }
	fmt.Fprintf(stdout, "%d forks of a %s bare guest (pool %v): fork to first instruction p50 %s, p99 %s\n",
		*n, *mem, *pool, q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond))
	return nil
}
