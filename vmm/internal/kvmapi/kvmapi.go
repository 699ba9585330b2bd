// Package kvmapi is the one place where tine's VMM talks to /dev/kvm. It
// re-exports what github.com/bobuhiro11/gokvm/kvm already wraps and adds
// thin wrappers on golang.org/x/sys/unix for what that package lacks or
// gets wrong for our use: KVM_RUN without swallowing EINTR, XSAVE/XSAVE2,
// a sized MSR index list, allocation-free MSR get/set, the dirty log,
// KVM_IRQ_LINE, and the kvm_run exit layout.
package kvmapi

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/bobuhiro11/gokvm/kvm"
	"golang.org/x/sys/unix"
)

// Types re-exported from gokvm so callers import one package.
type (
	// Regs are the general-purpose registers (struct kvm_regs).
	Regs = kvm.Regs
	// Sregs are the special registers (struct kvm_sregs).
	Sregs = kvm.Sregs
	// Segment is one segment register (struct kvm_segment).
	Segment = kvm.Segment
	// Descriptor is a GDT or IDT pointer (struct kvm_dtable).
	Descriptor = kvm.Descriptor
	// DebugRegs are the debug registers (struct kvm_debugregs).
	DebugRegs = kvm.DebugRegs
	// XCRS are the extended control registers (struct kvm_xcrs).
	XCRS = kvm.XCRS
	// LAPICState is the local APIC register page (struct kvm_lapic_state).
	LAPICState = kvm.LAPICState
	// MPState is the multiprocessing state (struct kvm_mp_state).
	MPState = kvm.MPState
	// VCPUEvents are pending exceptions, interrupts and NMIs.
	VCPUEvents = kvm.VCPUEvents
	// IRQChip is one in-kernel interrupt controller (struct kvm_irqchip).
	IRQChip = kvm.IRQChip
	// PITState2 is the in-kernel PIT state (struct kvm_pit_state2).
	PITState2 = kvm.PITState2
	// ClockData is the kvmclock state (struct kvm_clock_data).
	ClockData = kvm.ClockData
	// CPUID is a set of CPUID entries.
	CPUID = kvm.CPUID
	// UserspaceMemoryRegion is one memory slot.
	UserspaceMemoryRegion = kvm.UserspaceMemoryRegion
)

// Functions re-exported from gokvm, retried when a signal interrupts
// them (the Go runtime preempts threads with SIGURG, and slow ioctls such
// as KVM_CREATE_VM or KVM_SET_USER_MEMORY_REGION then fail with EINTR).
var (
	GetRegs             = retryR(kvm.GetRegs)
	SetRegs             = retry1(kvm.SetRegs)
	GetSregs            = retryR(kvm.GetSregs)
	SetSregs            = retry1(kvm.SetSregs)
	GetDebugRegs        = retry1(kvm.GetDebugRegs)
	SetDebugRegs        = retry1(kvm.SetDebugRegs)
	GetXCRS             = retry1(kvm.GetXCRS)
	SetXCRS             = retry1(kvm.SetXCRS)
	GetLocalAPIC        = retry1(kvm.GetLocalAPIC)
	SetLocalAPIC        = retry1(kvm.SetLocalAPIC)
	GetMPState          = retry1(kvm.GetMPState)
	SetMPState          = retry1(kvm.SetMPState)
	GetVCPUEvents       = retry1(kvm.GetVCPUEvents)
	SetVCPUEvents       = retry1(kvm.SetVCPUEvents)
	GetIRQChip          = retry1(kvm.GetIRQChip)
	SetIRQChip          = retry1(kvm.SetIRQChip)
	GetPIT2             = retry1(kvm.GetPIT2)
	SetPIT2             = retry1(kvm.SetPIT2)
	GetClock            = retry1(kvm.GetClock)
	SetClock            = retry1(kvm.SetClock)
	CreateIRQChip       = retry0(kvm.CreateIRQChip)
	CreatePIT2          = retry0(kvm.CreatePIT2)
	SetTSSAddr          = retry1(kvm.SetTSSAddr)
	SetIdentityMapAddr  = retry1(kvm.SetIdentityMapAddr)
	GetSupportedCPUID   = retry1(kvm.GetSupportedCPUID)
	SetCPUID2           = retry1(kvm.SetCPUID2)
	SetUserMemoryRegion = retry1(kvm.SetUserMemoryRegion)
)

func retry0(f func(uintptr) error) func(uintptr) error {
	return func(fd uintptr) error {
		for {
			if err := f(fd); !errors.Is(err, unix.EINTR) {
				return err
			}
		}
	}
}

func retry1[A any](f func(uintptr, A) error) func(uintptr, A) error {
	return func(fd uintptr, a A) error {
		for {
			if err := f(fd, a); !errors.Is(err, unix.EINTR) {
				return err
			}
		}
	}
}

func retryR[R any](f func(uintptr) (R, error)) func(uintptr) (R, error) {
	return func(fd uintptr) (R, error) {
		for {
			r, err := f(fd)
			if !errors.Is(err, unix.EINTR) {
				return r, err
			}
		}
	}
}

// ioctl request numbers not in gokvm, or needed with other semantics.
const (
	kvmio = 0xAE

	nrCheckExtension  = 0x03
	nrGetVCPUMmapSize = 0x04
	nrCreateVM        = 0x01
	nrGetMSRIndex     = 0x02
	nrCreateVCPU      = 0x41
	nrGetDirtyLog     = 0x42
	nrIRQLine         = 0x61
	nrRun             = 0x80
	nrGetMSRS         = 0x88
	nrSetMSRS         = 0x89
	nrGetXSAVE        = 0xa4
	nrSetXSAVE        = 0xa5
	nrGetXSAVE2       = 0xcf
)

// Capabilities probed with KVM_CHECK_EXTENSION.
const (
	CapIRQChip    = 0
	CapXSAVE      = 55
	CapXCRS       = 56
	CapDebugRegs  = 50
	CapVCPUEvents = 41
	CapXSAVE2     = 208
)

// Exit reasons (kvm_run.exit_reason).
const (
	ExitUnknown       = 0
	ExitException     = 1
	ExitIO            = 2
	ExitHypercall     = 3
	ExitDebug         = 4
	ExitHLT           = 5
	ExitMMIO          = 6
	ExitShutdown      = 8
	ExitFailEntry     = 9
	ExitIntr          = 10
	ExitInternalError = 17
	ExitSystemEvent   = 24
)

// IO directions in kvm_run.io.direction.
const (
	IOIn  = 0
	IOOut = 1
)

func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | kvmio<<8 | nr
}

func io(nr uintptr) uintptr         { return ioc(0, nr, 0) }
func iow(nr, size uintptr) uintptr  { return ioc(1, nr, size) }
func ior(nr, size uintptr) uintptr  { return ioc(2, nr, size) }
func iowr(nr, size uintptr) uintptr { return ioc(3, nr, size) }

// ioctl issues an ioctl, retrying when a signal interrupts it.
func ioctl(fd int, req, arg uintptr) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return r, errno
		}
		return r, nil
	}
}

// ioctlOnce issues an ioctl once: KVM_RUN reports EINTR to its caller.
func ioctlOnce(fd int, req, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// CreateVM creates a VM on the /dev/kvm descriptor.
func CreateVM(kvmFd int) (int, error) {
	r, err := ioctl(kvmFd, io(nrCreateVM), 0)
	return int(r), err
}

// CreateVCPU creates vCPU id on the VM.
func CreateVCPU(vmFd, id int) (int, error) {
	r, err := ioctl(vmFd, io(nrCreateVCPU), uintptr(id))
	return int(r), err
}

// VCPUMmapSize is the size of the kvm_run area to mmap on each vCPU fd.
func VCPUMmapSize(kvmFd int) (int, error) {
	r, err := ioctl(kvmFd, io(nrGetVCPUMmapSize), 0)
	return int(r), err
}

// CheckExtension returns the value of a capability (0 when absent).
func CheckExtension(fd int, capability int) int {
	r, err := ioctl(fd, io(nrCheckExtension), uintptr(capability))
	if err != nil {
		return 0
	}
	return int(r)
}

// Run enters the guest. Unlike gokvm's Run it reports EINTR, which is how
// a kicked vCPU comes back.
func Run(vcpuFd int) error {
	_, err := ioctlOnce(vcpuFd, io(nrRun), 0)
	return err
}

// MSRIndexList returns the MSRs KVM can save and restore on this host.
func MSRIndexList(kvmFd int) ([]uint32, error) {
	n := uint32(256)
	for range 4 {
		buf := make([]uint32, 1+n)
		buf[0] = n
		_, err := ioctl(kvmFd, iowr(nrGetMSRIndex, 4), uintptr(unsafe.Pointer(&buf[0])))
		if errors.Is(err, unix.E2BIG) {
			n = buf[0]
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("KVM_GET_MSR_INDEX_LIST: %w", err)
		}
		return buf[1 : 1+buf[0]], nil
	}
	return nil, fmt.Errorf("KVM_GET_MSR_INDEX_LIST: list keeps growing")
}

// MSREntry is one MSR index and value (struct kvm_msr_entry).
type MSREntry struct {
	Index    uint32
	Reserved uint32
	Data     uint64
}

// msrBuf builds a struct kvm_msrs in one allocation.
func msrBuf(entries []MSREntry) []uint64 {
	buf := make([]uint64, 1+2*len(entries))
	buf[0] = uint64(len(entries))
	for i, e := range entries {
		buf[1+2*i] = uint64(e.Index)
		buf[2+2*i] = e.Data
	}
	return buf
}

// GetMSRs fills the Data of each entry; it returns how many were read
// (KVM stops at the first MSR it cannot read).
func GetMSRs(vcpuFd int, entries []MSREntry) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	buf := msrBuf(entries)
	r, err := ioctl(vcpuFd, iowr(nrGetMSRS, 8), uintptr(unsafe.Pointer(&buf[0])))
	if err != nil {
		return 0, fmt.Errorf("KVM_GET_MSRS: %w", err)
	}
	for i := range entries {
		entries[i].Data = buf[2+2*i]
	}
	return int(r), nil
}

// SetMSRs writes the entries; it returns how many were written.
func SetMSRs(vcpuFd int, entries []MSREntry) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	buf := msrBuf(entries)
	r, err := ioctl(vcpuFd, iow(nrSetMSRS, 8), uintptr(unsafe.Pointer(&buf[0])))
	if err != nil {
		return 0, fmt.Errorf("KVM_SET_MSRS: %w", err)
	}
	return int(r), nil
}

// XSAVESize is the size of the buffer XSAVE state needs on this host: the
// value of KVM_CAP_XSAVE2 when present, else the legacy 4096 bytes.
func XSAVESize(vmFd int) int {
	if n := CheckExtension(vmFd, CapXSAVE2); n > 4096 {
		return n
	}
	return 4096
}

// GetXSAVE reads the vCPU's FPU/XSAVE area into buf (len XSAVESize).
func GetXSAVE(vcpuFd int, buf []byte) error {
	nr := uintptr(nrGetXSAVE)
	if len(buf) > 4096 {
		nr = nrGetXSAVE2
	} else if len(buf) < 4096 {
		return fmt.Errorf("KVM_GET_XSAVE: buffer of %d bytes, need 4096", len(buf))
	}
	_, err := ioctl(vcpuFd, ior(nr, 4096), uintptr(unsafe.Pointer(&buf[0])))
	if err != nil {
		return fmt.Errorf("KVM_GET_XSAVE: %w", err)
	}
	return nil
}

// SetXSAVE loads the vCPU's FPU/XSAVE area from buf.
func SetXSAVE(vcpuFd int, buf []byte) error {
	if len(buf) < 4096 {
		return fmt.Errorf("KVM_SET_XSAVE: buffer of %d bytes, need 4096", len(buf))
	}
	_, err := ioctl(vcpuFd, iow(nrSetXSAVE, 4096), uintptr(unsafe.Pointer(&buf[0])))
	if err != nil {
		return fmt.Errorf("KVM_SET_XSAVE: %w", err)
	}
	return nil
}

// GetDirtyLog fetches (and, without manual protect, clears) the dirty
// bitmap of a memory slot: one bit per 4 KiB page, bitmap sized for the
// slot rounded up to 64 pages.
func GetDirtyLog(vmFd int, slot uint32, bitmap []uint64) error {
	if len(bitmap) == 0 {
		return nil
	}
	arg := struct {
		Slot   uint32
		_      uint32
		Bitmap uint64
	}{Slot: slot, Bitmap: uint64(uintptr(unsafe.Pointer(&bitmap[0])))}
	_, err := ioctl(vmFd, iow(nrGetDirtyLog, unsafe.Sizeof(arg)), uintptr(unsafe.Pointer(&arg)))
	if err != nil {
		return fmt.Errorf("KVM_GET_DIRTY_LOG slot %d: %w", slot, err)
	}
	return nil
}

// IRQLine raises (level 1) or lowers (level 0) an interrupt line of the
// in-kernel irqchip.
func IRQLine(vmFd int, irq, level uint32) error {
	arg := [2]uint32{irq, level}
	_, err := ioctl(vmFd, iow(nrIRQLine, 8), uintptr(unsafe.Pointer(&arg)))
	if err != nil {
		return fmt.Errorf("KVM_IRQ_LINE irq %d: %w", irq, err)
	}
	return nil
}

// Run area layout (struct kvm_run), offsets used by the VMM.
const (
	RunImmediateExit = 1
	RunExitReason    = 8
	RunUnion         = 32
)

// IOExit is the kvm_run.io member.
type IOExit struct {
	Direction  uint8
	Size       uint8
	Port       uint16
	Count      uint32
	DataOffset uint64
}

// MMIOExit is the kvm_run.mmio member.
type MMIOExit struct {
	PhysAddr uint64
	Data     [8]byte
	Len      uint32
	IsWrite  uint8
}

// InternalExit is the kvm_run.internal member.
type InternalExit struct {
	Suberror uint32
	NData    uint32
	Data     [16]uint64
}

// RunArea is a vCPU's mmapped kvm_run area.
type RunArea []byte

// ExitReason returns kvm_run.exit_reason.
func (r RunArea) ExitReason() uint32 {
	return *(*uint32)(unsafe.Pointer(&r[RunExitReason]))
}

// SetImmediateExit sets kvm_run.immediate_exit.
func (r RunArea) SetImmediateExit(v bool) {
	var b uint8
	if v {
		b = 1
	}
	*(*uint8)(unsafe.Pointer(&r[RunImmediateExit])) = b
}

// IO returns the kvm_run.io member.
func (r RunArea) IO() *IOExit { return (*IOExit)(unsafe.Pointer(&r[RunUnion])) }

// MMIO returns the kvm_run.mmio member.
func (r RunArea) MMIO() *MMIOExit { return (*MMIOExit)(unsafe.Pointer(&r[RunUnion])) }

// Internal returns the kvm_run.internal member.
func (r RunArea) Internal() *InternalExit { return (*InternalExit)(unsafe.Pointer(&r[RunUnion])) }

// FailEntryReason returns kvm_run.fail_entry.hardware_entry_failure_reason.
func (r RunArea) FailEntryReason() uint64 {
	return *(*uint64)(unsafe.Pointer(&r[RunUnion]))
}

// CPUIDEntry is one CPUID leaf (struct kvm_cpuid_entry2).
type CPUIDEntry = kvm.CPUIDEntry2
