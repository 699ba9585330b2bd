package vmm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"tine/vmm/internal/kvmapi"
)

// Register types, as KVM defines them.
type (
	// Regs are a vCPU's general-purpose registers.
	Regs = kvmapi.Regs
	// Sregs are a vCPU's special registers: segments, CR0-CR4, EFER,
	// GDT and IDT.
	Sregs = kvmapi.Sregs
	// Segment is one segment register.
	Segment = kvmapi.Segment
	// Descriptor is a GDT or IDT base and limit.
	Descriptor = kvmapi.Descriptor
	// XCRS are a vCPU's extended control registers.
	XCRS = kvmapi.XCRS
	// LAPICState is a local APIC's register page.
	LAPICState = kvmapi.LAPICState
	// VCPUEvents are a vCPU's pending exceptions, interrupts and NMIs.
	VCPUEvents = kvmapi.VCPUEvents
	// DebugRegs are a vCPU's debug registers.
	DebugRegs = kvmapi.DebugRegs
	// IRQChip is the state of one in-kernel interrupt controller.
	IRQChip = kvmapi.IRQChip
	// PITState2 is the in-kernel PIT's state.
	PITState2 = kvmapi.PITState2
	// ClockData is the kvmclock state.
	ClockData = kvmapi.ClockData
)

// PageSize is the guest page size tine tracks, seals and forks by.
const PageSize = 4096

// Default addresses of the TSS and identity-map pages KVM needs on Intel
// hosts when an irqchip is created; just under 4 GiB, as QEMU places them.
const (
	DefaultTSSAddr         = 0xfffbd000
	DefaultIdentityMapAddr = 0xfffbc000
)

// Config describes a VM to create.
type Config struct {
	// MemSize is the guest RAM size in bytes, a multiple of 4 KiB. RAM
	// is guest-physical 0..MemSize, backed by a sparse memfd.
	MemSize uint64
	// VCPUs is the number of vCPUs (default 1).
	VCPUs int
	// IRQChip creates the in-kernel irqchip (PIC, IOAPIC, LAPICs) and
	// the PIT, as Linux guests need. It also sets the TSS and
	// identity-map addresses below.
	IRQChip bool
	// TSSAddr and IdentityMapAddr override the defaults used with IRQChip.
	TSSAddr, IdentityMapAddr uint32
	// DirtyLog turns on KVM dirty-page logging for RAM, which
	// incremental snapshots use.
	DirtyLog bool
	// Console receives the bytes a guest writes to PortConsole; nil
	// discards them.
	Console io.Writer
	// OnReport is called, on the vCPU's thread, for each value a guest
	// reports on PortReport. The newest values are also kept (see
	// Reports).
	OnReport func(vm *VM, value uint32)
	// MaxReports is how many reported values the VM keeps; older ones
	// are dropped and counted (ReportsDropped). Zero means
	// DefaultMaxReports.
	MaxReports int
	// OnRequest handles a guest's snapshot or fork request. It runs with
	// every vCPU stopped; its result is returned to the guest in RAX.
	// Without it, such requests end Run with an error. An error wrapping
	// ErrLimit refuses the request: the guest gets RequestRefused and
	// runs on. Other errors end Run.
	OnRequest func(ctx context.Context, vm *VM, req Request) (uint64, error)
	// OnRefused is told of each guest request refused because of a
	// limit (Limits, or an ErrLimit from OnRequest), with the reason.
	OnRefused func(vm *VM, req Request, err error)
	// Limits bound the forks and snapshots the VM's family of guests
	// may ask for. They are taken from the Config of the VM that starts
	// a family (New, or the image a family is forked from).
	Limits Limits
}

// VM is one KVM virtual machine: its RAM, vCPUs and devices.
type VM struct {
	cfg   Config
	kvm   *os.File
	vmFd  int
	memfd int    // backing file of RAM while shared; -1 once private
	mem   []byte // guest-physical 0..MemSize
	vcpus []*VCPU

	ports []portRange
	mmios []mmioRange

	// stopped-state control (see Pause, Run)
	mu         sync.Mutex
	cond       *sync.Cond
	pauses     int
	running    bool
	kick       chan struct{}
	stop       atomic.Bool
	runMu      sync.Mutex
	exitCode   atomic.Int64
	exited     atomic.Bool
	reports    reportRing
	family     *family  // nil until the VM is handed out (pool VMs)
	depth      int      // fork generation within the family
	heldVCPUs  int      // vCPUs taken from the process allowance
	index      int      // child index for forked VMs (0 for others)
	image      *Image   // sealed image RAM is mapped from, nil when RAM is the VM's own
	dirty      []uint64 // dirty pages not yet in a snapshot (DirtyLog)
	kvmDirty   []uint64 // scratch for KVM_GET_DIRTY_LOG
	snap       *snapTracker
	uffd       *userfault
	msrIndices []uint32
	xsaveSize  int
	closed     bool
}

// VCPU is one virtual CPU, run on its own locked OS thread.
type VCPU struct {
	vm   *VM
	id   int
	fd   int
	run  kvmapi.RunArea
	tid  atomic.Int32
	cmds chan func()
}

// New creates a VM with zeroed RAM and vCPUs in their reset state. Each
// vCPU gets the host's supported CPUID.
func New(ctx context.Context, cfg Config) (*VM, error) {
	if cfg.MemSize == 0 || cfg.MemSize%PageSize != 0 {
		return nil, fmt.Errorf("vmm: memory size %d is not a positive multiple of %d", cfg.MemSize, PageSize)
	}
	vm, err := newVM(ctx, cfg)
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("tine-vm-ram", unix.MFD_CLOEXEC)
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: memfd for guest RAM: %w", err)
	}
	vm.family = newFamily(cfg.Limits)
	vm.family.join()
	vm.memfd = fd
	if err := unix.Ftruncate(fd, int64(cfg.MemSize)); err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: size guest RAM memfd to %d: %w", cfg.MemSize, err)
	}
	if _, err := unix.MmapPtr(fd, 0, unsafePointer(vm.mem), uintptr(cfg.MemSize),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED|unix.MAP_NORESERVE); err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: map guest RAM memfd: %w", err)
	}
	return vm, nil
}

// newVM creates the KVM VM, a placeholder RAM mapping registered as slot
// 0, and the vCPUs.
func newVM(ctx context.Context, cfg Config) (*VM, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.VCPUs <= 0 {
		cfg.VCPUs = 1
	}
	if cfg.VCPUs > 64 {
		return nil, fmt.Errorf("vmm: %d vCPUs, at most 64", cfg.VCPUs)
	}
	if err := reserveVCPUs(cfg.VCPUs); err != nil {
		return nil, err
	}
	kvmFile, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		releaseVCPUs(cfg.VCPUs)
		return nil, fmt.Errorf("vmm: open /dev/kvm: %w", err)
	}
	vm := &VM{cfg: cfg, kvm: kvmFile, vmFd: -1, memfd: -1, kick: make(chan struct{}, 1), heldVCPUs: cfg.VCPUs}
	vm.reports.max = maxReports(cfg)
	vm.cond = sync.NewCond(&vm.mu)
	kfd := int(kvmFile.Fd())
	vm.vmFd, err = kvmapi.CreateVM(kfd)
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: KVM_CREATE_VM on /dev/kvm: %w", err)
	}
	if cfg.IRQChip {
		tss, idmap := cfg.TSSAddr, cfg.IdentityMapAddr
		if tss == 0 {
			tss = DefaultTSSAddr
		}
		if idmap == 0 {
			idmap = DefaultIdentityMapAddr
		}
		if err := kvmapi.SetIdentityMapAddr(uintptr(vm.vmFd), idmap); err != nil {
			vm.Close()
			return nil, fmt.Errorf("vmm: KVM_SET_IDENTITY_MAP_ADDR %#x: %w", idmap, err)
		}
		if err := kvmapi.SetTSSAddr(uintptr(vm.vmFd), tss); err != nil {
			vm.Close()
			return nil, fmt.Errorf("vmm: KVM_SET_TSS_ADDR %#x: %w", tss, err)
		}
		if err := kvmapi.CreateIRQChip(uintptr(vm.vmFd)); err != nil {
			vm.Close()
			return nil, fmt.Errorf("vmm: KVM_CREATE_IRQCHIP: %w", err)
		}
		if err := kvmapi.CreatePIT2(uintptr(vm.vmFd)); err != nil {
			vm.Close()
			return nil, fmt.Errorf("vmm: KVM_CREATE_PIT2: %w", err)
		}
	}
	// Reserve the RAM range with an anonymous placeholder; the real
	// backing (memfd or sealed image) is mapped over it with MAP_FIXED,
	// so the memory slot never has to change.
	mem, err := unix.Mmap(-1, 0, int(cfg.MemSize), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: reserve %d bytes of guest RAM: %w", cfg.MemSize, err)
	}
	vm.mem = mem
	region := kvmapi.UserspaceMemoryRegion{Slot: 0, GuestPhysAddr: 0, MemorySize: cfg.MemSize, UserspaceAddr: uint64(vm.memAddr())}
	if cfg.DirtyLog {
		region.SetMemLogDirtyPages()
		vm.dirty = make([]uint64, (cfg.MemSize/PageSize+63)/64)
		vm.kvmDirty = make([]uint64, len(vm.dirty))
	}
	if err := kvmapi.SetUserMemoryRegion(uintptr(vm.vmFd), &region); err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: KVM_SET_USER_MEMORY_REGION of %d bytes: %w", cfg.MemSize, err)
	}
	vm.xsaveSize = kvmapi.XSAVESize(vm.vmFd)
	vm.msrIndices, err = kvmapi.MSRIndexList(kfd)
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: /dev/kvm: %w", err)
	}
	cpuid := &kvmapi.CPUID{Nent: 256, Entries: make([]kvmapi.CPUIDEntry, 256)}
	if err := kvmapi.GetSupportedCPUID(uintptr(kfd), cpuid); err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: KVM_GET_SUPPORTED_CPUID: %w", err)
	}
	mmapSize, err := kvmapi.VCPUMmapSize(kfd)
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("vmm: KVM_GET_VCPU_MMAP_SIZE: %w", err)
	}
	for i := range cfg.VCPUs {
		c, err := vm.newVCPU(i, mmapSize, cpuid)
		if err != nil {
			vm.Close()
			return nil, err
		}
		vm.vcpus = append(vm.vcpus, c)
	}
	return vm, nil
}

func (vm *VM) newVCPU(id, mmapSize int, cpuid *kvmapi.CPUID) (*VCPU, error) {
	c := &VCPU{vm: vm, id: id, fd: -1, cmds: make(chan func())}
	ready := make(chan error, 1)
	go c.thread(ready)
	var err error
	c.do(func() {
		c.fd, err = kvmapi.CreateVCPU(vm.vmFd, id)
		if err != nil {
			err = fmt.Errorf("vmm: KVM_CREATE_VCPU %d: %w", id, err)
			return
		}
		var run []byte
		run, err = unix.Mmap(c.fd, 0, mmapSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			err = fmt.Errorf("vmm: mmap kvm_run of vCPU %d: %w", id, err)
			return
		}
		c.run = run
		if err = kvmapi.SetCPUID2(uintptr(c.fd), cpuid); err != nil {
			err = fmt.Errorf("vmm: KVM_SET_CPUID2 on vCPU %d: %w", id, err)
		}
	})
	if err != nil {
		c.stopThread()
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
		return nil, err
	}
	return c, nil
}

// thread is the vCPU's OS thread: it runs the functions sent on cmds.
func (c *VCPU) thread(ready chan error) {
	runtime.LockOSThread()
	c.tid.Store(int32(unix.Gettid()))
	for f := range c.cmds {
		f()
	}
	// The thread stays locked and exits with the goroutine.
}

// do runs f on the vCPU's thread and waits for it.
func (c *VCPU) do(f func()) {
	done := make(chan struct{})
	c.cmds <- func() { f(); close(done) }
	<-done
}

func (c *VCPU) stopThread() {
	if c.cmds != nil {
		close(c.cmds)
		c.cmds = nil
	}
}

// ID returns the vCPU's index.
func (c *VCPU) ID() int { return c.id }

// Mem returns guest RAM: guest-physical address a is Mem()[a]. The slice
// stays valid until Close, also across snapshots and forks.
func (vm *VM) Mem() []byte { return vm.mem }

// MemSize returns the guest RAM size in bytes.
func (vm *VM) MemSize() uint64 { return vm.cfg.MemSize }

// VCPUs returns the VM's vCPUs.
func (vm *VM) VCPUs() []*VCPU { return vm.vcpus }

// VCPU returns vCPU i.
func (vm *VM) VCPU(i int) *VCPU { return vm.vcpus[i] }

// Index returns the child index of a forked VM (1..N), or 0.
func (vm *VM) Index() int { return vm.index }

// ExitCode returns the code the guest passed on PortExit.
func (vm *VM) ExitCode() int { return int(vm.exitCode.Load()) }

// Reports returns the values the guest reported on PortReport, oldest
// first: all of them, or the newest Config.MaxReports.
func (vm *VM) Reports() []uint32 {
	v, _ := vm.reports.values()
	return v
}

// ReportsDropped returns how many reported values were dropped to keep
// only the newest Config.MaxReports.
func (vm *VM) ReportsDropped() uint64 {
	_, n := vm.reports.values()
	return n
}

func maxReports(cfg Config) int {
	if cfg.MaxReports > 0 {
		return cfg.MaxReports
	}
	return DefaultMaxReports
}

func (vm *VM) memAddr() uintptr {
	return uintptr(unsafePointer(vm.mem))
}

// Regs returns the vCPU's general-purpose registers. The vCPU must be
// stopped (before Run, after it, or while paused).
func (c *VCPU) Regs() (*Regs, error) {
	r, err := kvmapi.GetRegs(uintptr(c.fd))
	if err != nil {
		return nil, fmt.Errorf("vmm: KVM_GET_REGS on vCPU %d: %w", c.id, err)
	}
	return r, nil
}

// SetRegs sets the vCPU's general-purpose registers. A VM whose guest
// exited may be run again after its registers were set.
func (c *VCPU) SetRegs(r *Regs) error {
	if err := kvmapi.SetRegs(uintptr(c.fd), r); err != nil {
		return fmt.Errorf("vmm: KVM_SET_REGS on vCPU %d: %w", c.id, err)
	}
	c.vm.exited.Store(false)
	return nil
}

// Sregs returns the vCPU's special registers.
func (c *VCPU) Sregs() (*Sregs, error) {
	s, err := kvmapi.GetSregs(uintptr(c.fd))
	if err != nil {
		return nil, fmt.Errorf("vmm: KVM_GET_SREGS on vCPU %d: %w", c.id, err)
	}
	return s, nil
}

// SetSregs sets the vCPU's special registers (segments, control
// registers, EFER, GDT, IDT).
func (c *VCPU) SetSregs(s *Sregs) error {
	if err := kvmapi.SetSregs(uintptr(c.fd), s); err != nil {
		return fmt.Errorf("vmm: KVM_SET_SREGS on vCPU %d: %w", c.id, err)
	}
	return nil
}

// SetXCR0 sets the vCPU's XCR0 (which XSAVE features the guest enabled).
func (c *VCPU) SetXCR0(v uint64) error {
	x := kvmapi.XCRS{NrXRCS: 1}
	x.Registers[0].XRC = 0
	x.Registers[0].Value = v
	if err := kvmapi.SetXCRS(uintptr(c.fd), &x); err != nil {
		return fmt.Errorf("vmm: KVM_SET_XCRS on vCPU %d: %w", c.id, err)
	}
	return nil
}

// SetIRQ raises or lowers an interrupt line of the in-kernel irqchip
// (Config.IRQChip). Devices may call it from any goroutine.
func (vm *VM) SetIRQ(irq uint32, high bool) error {
	var level uint32
	if high {
		level = 1
	}
	return kvmapi.IRQLine(vm.vmFd, irq, level)
}

// Close stops the VM (a Run in progress returns ErrClosed) and releases
// its vCPUs, RAM and descriptors. Do not call it from OnRequest.
func (vm *VM) Close() error {
	vm.mu.Lock()
	if vm.closed {
		vm.mu.Unlock()
		return nil
	}
	// Stop a Run in progress: it sees closed and returns.
	vm.closed = true
	if vm.running {
		select {
		case vm.kick <- struct{}{}:
		default:
		}
		for vm.running {
			vm.cond.Wait()
		}
	}
	vm.cond.Broadcast()
	vm.mu.Unlock()
	vm.runMu.Lock() // wait for Run to return
	defer vm.runMu.Unlock()
	for _, c := range vm.vcpus {
		c.stopThread()
		if c.run != nil {
			unix.Munmap(c.run)
		}
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
	}
	if vm.uffd != nil {
		vm.uffd.close()
		vm.uffd = nil
	}
	if vm.mem != nil {
		unix.Munmap(vm.mem)
		vm.mem = nil
	}
	if vm.image != nil {
		vm.image.unref()
		vm.image = nil
	}
	if vm.memfd >= 0 {
		unix.Close(vm.memfd)
	}
	if vm.vmFd >= 0 {
		unix.Close(vm.vmFd)
	}
	if vm.kvm != nil {
		vm.kvm.Close()
	}
	releaseVCPUs(vm.heldVCPUs)
	if vm.family != nil {
		vm.family.leave()
	}
	return nil
}

// Pause stops every vCPU and keeps them stopped until the matching
// Resume. It returns at once when the VM is not running. Pauses nest.
func (vm *VM) Pause() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	vm.pauses++
	if vm.running {
		select {
		case vm.kick <- struct{}{}:
		default:
		}
		for vm.running {
			vm.cond.Wait()
		}
	}
}

// Resume undoes one Pause.
func (vm *VM) Resume() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.pauses > 0 {
		vm.pauses--
	}
	vm.cond.Broadcast()
}

// kickAll makes every vCPU leave KVM_RUN soon: immediate_exit stops the
// next entry and a signal interrupts the current one. SIGURG is the
// signal the Go runtime already uses to preempt threads, so it is
// harmless to the rest of the process.
func (vm *VM) kickAll() {
	pid := unix.Getpid()
	for _, c := range vm.vcpus {
		c.run.SetImmediateExit(true)
		if tid := c.tid.Load(); tid != 0 {
			unix.Tgkill(pid, int(tid), unix.SIGURG)
		}
	}
}

// errStopped is a vCPU loop's result when it was stopped from outside.
var errStopped = errors.New("vCPU stopped")
