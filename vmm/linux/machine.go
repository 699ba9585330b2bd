package linux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"tine/vmm"
	"tine/vmm/serial"
	"tine/vmm/virtio"
)

// DefaultMemSize is the guest RAM a Machine gets when none is asked for.
const DefaultMemSize = 512 << 20

// MaxVCPUs is the most vCPUs a Machine describes to its guest.
const MaxVCPUs = maxMPCPUs

// PortRange is a device a Machine adds to its I/O port space.
type PortRange struct {
	Base, Size uint16
	Dev        vmm.PortDevice
}

// MachineConfig describes a Linux virtual machine.
type MachineConfig struct {
	// Kernel is a bzImage or an uncompressed vmlinux with a PVH note.
	Kernel []byte
	// Initrd is the initial ramdisk; empty for none.
	Initrd []byte
	// Cmdline is the kernel command line; "console=ttyS0" puts the
	// console on the serial port.
	Cmdline string
	// MemSize is the guest RAM size (default DefaultMemSize, at most
	// MaxMem).
	MemSize uint64
	// VCPUs is the number of vCPUs (default 1), described to the guest
	// in an ACPI MADT and an MP table, with the IOAPIC.
	VCPUs int
	// Console receives the guest's serial output (COM1); nil discards it.
	Console io.Writer
	// Ports are further port devices; the machine's own (COM1, the CMOS
	// clock, the keyboard controller's reset line) must not overlap them.
	Ports []PortRange
	// Virtio are virtio devices, put on virtio-mmio transports and
	// described in the DSDT (at most MaxVirtio).
	Virtio []virtio.Device
}

// Machine is a KVM VM set up to boot Linux: in-kernel PIC, IOAPIC, LAPICs
// and PIT, a 16550A on COM1 (IRQ 4), a CMOS clock, a keyboard controller
// that only knows the reset command, ACPI tables with a PM1 register block
// for power-off, and every other port reading as all-ones and ignoring
// writes, as an empty ISA bus does.
type Machine struct {
	VM   *vmm.VM
	Boot *Boot
	UART *serial.UART
	// Virtio are the transports of MachineConfig.Virtio, in order.
	Virtio []*virtio.Transport

	fds    []int      // irqfds
	files  []*os.File // ioeventfds
	mu     sync.Mutex
	cancel context.CancelFunc
	reset  atomic.Bool
}

// NewMachine creates the VM, its devices and loads the kernel; the boot
// vCPU is left at the kernel's entry. Call Run to boot.
func NewMachine(ctx context.Context, cfg MachineConfig) (*Machine, error) {
	if cfg.MemSize == 0 {
		cfg.MemSize = DefaultMemSize
	}
	if cfg.VCPUs == 0 {
		cfg.VCPUs = 1
	}
	if cfg.MemSize > MaxMem || cfg.MemSize%vmm.PageSize != 0 {
		return nil, fmt.Errorf("linux machine: memory size %d is not a multiple of %d at most %d", cfg.MemSize, vmm.PageSize, uint64(MaxMem))
	}
	if cfg.VCPUs < 1 || cfg.VCPUs > maxMPCPUs {
		return nil, fmt.Errorf("linux machine: %d vCPUs, want 1 to %d", cfg.VCPUs, maxMPCPUs)
	}
	vm, err := vmm.New(ctx, vmm.Config{MemSize: cfg.MemSize, VCPUs: cfg.VCPUs, IRQChip: true})
	if err != nil {
		return nil, fmt.Errorf("linux machine: %w", err)
	}
	if err := vm.SetGuestCPUID(); err != nil {
		vm.Close()
		return nil, fmt.Errorf("linux machine: %w", err)
	}
	m := &Machine{VM: vm}
	if err := m.addPortDevices(cfg, nil); err != nil {
		vm.Close()
		return nil, fmt.Errorf("linux machine: %w", err)
	}
	b, err := Load(vm.Mem(), cfg.Kernel, Config{Cmdline: cfg.Cmdline, Initrd: cfg.Initrd})
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("linux machine: load kernel: %w", err)
	}
	m.Boot = b
	if err := writeMPTable(vm.Mem(), cfg.VCPUs); err != nil {
		vm.Close()
		return nil, fmt.Errorf("linux machine: %w", err)
	}
	slots, err := m.addVirtio(cfg.Virtio)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("linux machine: virtio: %w", err)
	}
	rsdp, err := writeACPI(vm.Mem(), cfg.VCPUs, slots...)
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("linux machine: %w", err)
	}
	b.setRSDP(vm.Mem(), rsdp)
	if err := setBootState(vm.VCPU(0), b); err != nil {
		vm.Close()
		return nil, fmt.Errorf("linux machine: %w", err)
	}
	return m, nil
}

// addPortDevices adds the machine's own port devices and cfg.Ports; the
// UART starts in state from when given (a fork or a clone).
func (m *Machine) addPortDevices(cfg MachineConfig, from *serial.State) error {
	vm := m.VM
	sc := serial.Config{
		Base: serial.COM1Base,
		Out:  cfg.Console,
		IRQ:  func(high bool) { vm.SetIRQ(serial.COM1IRQ, high) },
	}
	if from != nil {
		m.UART = serial.NewFromState(sc, *from)
	} else {
		m.UART = serial.New(sc)
	}
	devs := append([]PortRange{
		{serial.COM1Base, serial.Ports, m.UART},
		{cmosBase, 2, newCMOS()},
		{i8042Base, 5, &i8042{reset: m.requestReset}},
		{pm1EvtBase, pmPorts, &pmDevice{powerOff: m.requestReset}},
	}, cfg.Ports...)
	return addPorts(vm, devs)
}

// addPorts registers devs and fills every other port outside the VMM's
// hypercall range with an empty-bus device.
func addPorts(vm *vmm.VM, devs []PortRange) error {
	reserved := []PortRange{{Base: 0x500, Size: 8}} // the VMM's hypercall ports
	all := append(append([]PortRange(nil), devs...), reserved...)
	sort.Slice(all, func(i, j int) bool { return all[i].Base < all[j].Base })
	next := uint32(0)
	for _, d := range all {
		if uint32(d.Base) < next {
			return fmt.Errorf("port device at %#x+%d overlaps the one before it", d.Base, d.Size)
		}
		if uint32(d.Base) > next {
			if err := vm.AddPortDevice(uint16(next), uint16(uint32(d.Base)-next), emptyBus{}); err != nil {
				return err
			}
		}
		if d.Dev != nil {
			if err := vm.AddPortDevice(d.Base, d.Size, d.Dev); err != nil {
				return err
			}
		}
		next = uint32(d.Base) + uint32(d.Size)
	}
	if next < 0x10000 {
		return vm.AddPortDevice(uint16(next), uint16(0x10000-next), emptyBus{})
	}
	return nil
}

// setBootState puts the loader's register state into the boot vCPU,
// keeping what KVM set up that the loader does not describe (APIC base).
func setBootState(c *vmm.VCPU, b *Boot) error {
	s, err := c.Sregs()
	if err != nil {
		return err
	}
	seg := func(x Segment) vmm.Segment {
		return vmm.Segment{Base: x.Base, Limit: x.Limit, Selector: x.Selector, Typ: x.Type, Present: x.Present,
			DPL: x.DPL, DB: x.DB, S: x.S, L: x.L, G: x.G, AVL: x.AVL, Unusable: x.Unusable}
	}
	bs := b.Sregs
	s.CS, s.DS, s.ES, s.FS, s.GS, s.SS = seg(bs.CS), seg(bs.DS), seg(bs.ES), seg(bs.FS), seg(bs.GS), seg(bs.SS)
	s.TR, s.LDT = seg(bs.TR), seg(bs.LDT)
	s.GDT = vmm.Descriptor{Base: bs.GDT.Base, Limit: bs.GDT.Limit}
	s.IDT = vmm.Descriptor{Base: bs.IDT.Base, Limit: bs.IDT.Limit}
	s.CR0, s.CR2, s.CR3, s.CR4, s.CR8, s.EFER = bs.CR0, bs.CR2, bs.CR3, bs.CR4, bs.CR8, bs.EFER
	if err := c.SetSregs(s); err != nil {
		return err
	}
	r := vmm.Regs(b.Regs)
	return c.SetRegs(&r)
}

// Run boots the guest and returns when it powers off or resets (nil: a
// machine without firmware ends there), when it faults, or when ctx ends.
func (m *Machine) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.mu.Lock()
	m.cancel = cancel
	m.mu.Unlock()
	if m.reset.Load() {
		return nil
	}
	err := m.VM.Run(ctx)
	if m.reset.Load() || errors.Is(err, vmm.ErrTripleFault) {
		return nil
	}
	return err
}

// requestReset is called when the guest pulses the reset line (keyboard
// controller) or enters S5 (ACPI power-off): either ends Run.
func (m *Machine) requestReset() {
	m.reset.Store(true)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		m.cancel()
	}
}

// Close releases the VM and the devices' eventfds.
func (m *Machine) Close() error {
	err := m.VM.Close()
	for _, fd := range m.fds {
		unix.Close(fd)
	}
	m.fds = nil
	for _, f := range m.files {
		f.Close()
	}
	m.files = nil
	return err
}
