// Package linux loads a Linux kernel into guest memory and returns the
// register state the boot vCPU must start with.
//
// Two entry paths are supported:
//
//   - bzImage through the x86 64-bit boot protocol: the protected-mode
//     kernel is copied to 1 MiB, a boot_params "zero page" with an e820 map,
//     the command line and the initrd is written below 1 MiB, identity page
//     tables map the first 4 GiB, and the vCPU enters at load address +
//     0x200 in 64-bit mode with RSI pointing at boot_params.
//   - an uncompressed vmlinux ELF through PVH: the PT_LOAD segments are
//     copied to their physical addresses, an hvm_start_info with a memory
//     map, the command line and the initrd as module 0 is written, and the
//     vCPU enters at the XEN_ELFNOTE_PHYS32_ENTRY address in 32-bit
//     protected mode with paging off and EBX pointing at the start info.
//
// Everything here is a pure function over a []byte that is guest physical
// memory from address 0: the caller maps it, runs the vCPU and provides the
// devices. The kernel image is untrusted input; every size and offset read
// from it is checked against the image and against guest RAM.
package linux

import (
	"bytes"
	"errors"
	"fmt"
)

// Regs is the general-purpose register state of the boot vCPU, laid out
// like struct kvm_regs.
type Regs struct {
	RAX, RBX, RCX, RDX, RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11, R12, R13, R14, R15   uint64
	RIP, RFLAGS                            uint64
}

// Segment is one segment register including its hidden part, laid out
// like struct kvm_segment.
type Segment struct {
	Base     uint64
	Limit    uint32
	Selector uint16
	Type     uint8
	Present  uint8
	DPL      uint8
	DB       uint8
	S        uint8
	L        uint8
	G        uint8
	AVL      uint8
	Unusable uint8
	_        uint8
}

// DTable is a descriptor-table register (GDTR or IDTR).
type DTable struct {
	Base  uint64
	Limit uint16
}

// Sregs is the system register state of the boot vCPU: the fields of
// struct kvm_sregs that a boot sets.
type Sregs struct {
	CS, DS, ES, FS, GS, SS Segment
	TR, LDT                Segment
	GDT, IDT               DTable
	CR0, CR2, CR3, CR4     uint64
	CR8, EFER              uint64
}

// Protocol names the entry path a kernel was loaded for.
type Protocol string

// The entry paths.
const (
	ProtocolBzImage Protocol = "bzImage"
	ProtocolPVH     Protocol = "pvh"
)

// Config is what a boot passes to the kernel besides the image.
type Config struct {
	// Cmdline is the kernel command line.
	Cmdline string
	// Initrd is the initial ramdisk (a cpio archive, maybe compressed);
	// empty for none.
	Initrd []byte
}

// Boot is the result of loading a kernel: where things went and the state
// the boot vCPU starts in.
type Boot struct {
	Protocol Protocol
	Regs     Regs
	Sregs    Sregs
	// KernelStart and KernelEnd bound the guest physical range reserved
	// for the kernel (for a bzImage: up to load address + init_size).
	KernelStart, KernelEnd uint64
	// InitrdAddr and InitrdSize locate the initrd (0, 0 for none).
	InitrdAddr, InitrdSize uint64
	// CmdlineAddr is the guest physical address of the command line.
	CmdlineAddr uint64
	// Entry is the guest physical address the vCPU starts at.
	Entry uint64
}

// Guest physical layout below 1 MiB, shared by both entry paths.
const (
	gdtAddr       = 0x0500
	bootInfoAddr  = 0x7000  // boot_params or hvm_start_info + tables
	pml4Addr      = 0x9000  // PML4; PDPT at +0x1000, 4 PDs after it
	cmdlineAddr   = 0x20000 // command line, up to maxCmdline bytes
	maxCmdline    = 0x10000
	stackTop      = 0x8ff0
	lowRAMTop     = 0x9fc00  // top of conventional memory (EBDA above)
	highRAMStart  = 0x100000 // 1 MiB
	kernelLoad    = highRAMStart
	mmioHoleStart = 0xc0000000 // RAM must end below this: devices live above
	pageSize      = 0x1000
)

// MaxMem is the largest guest RAM the loader accepts: RAM is one range from
// address 0 and must stay below the 32-bit device hole at 3 GiB.
const MaxMem = mmioHoleStart

// minMem is the smallest guest RAM that holds the fixed low layout.
const minMem = 2 << 20

// e820 memory types.
const (
	e820RAM      = 1
	e820Reserved = 2
)

type e820Entry struct {
	Addr, Size uint64
	Type       uint32
}

// memoryMap returns the e820 map for memSize bytes of RAM from address 0.
func memoryMap(memSize uint64) []e820Entry {
	return []e820Entry{
		{0, lowRAMTop, e820RAM},
		{lowRAMTop, highRAMStart - lowRAMTop, e820Reserved},
		{highRAMStart, memSize - highRAMStart, e820RAM},
	}
}

// IsELF reports whether kernel starts with the ELF magic (a vmlinux, booted
// through PVH) rather than being a bzImage.
func IsELF(kernel []byte) bool {
	return bytes.HasPrefix(kernel, []byte("\x7fELF"))
}

// Load loads kernel into mem by the protocol its format calls for: PVH for
// an ELF vmlinux, the 64-bit boot protocol for a bzImage.
func Load(mem, kernel []byte, cfg Config) (*Boot, error) {
	if IsELF(kernel) {
		return LoadPVH(mem, kernel, cfg)
	}
	return LoadBzImage(mem, kernel, cfg)
}

// ErrBadImage is returned (wrapped) for a kernel image that is malformed or
// unsupported.
var ErrBadImage = errors.New("bad kernel image")

func imageErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadImage, fmt.Sprintf(format, a...))
}

// checkMem validates the guest RAM size for the fixed layout.
func checkMem(mem []byte) error {
	n := uint64(len(mem))
	if n < minMem {
		return fmt.Errorf("guest RAM of %d bytes is below the minimum of %d", n, minMem)
	}
	if n > MaxMem {
		return fmt.Errorf("guest RAM of %d bytes is above the maximum of %d (RAM must end below the 3 GiB device hole)", n, uint64(MaxMem))
	}
	return nil
}

// inRAM reports whether [addr, addr+size) lies inside RAM of memSize bytes
// without overflowing.
func inRAM(addr, size, memSize uint64) bool {
	end := addr + size
	return end >= addr && end <= memSize
}

// placeCmdline writes the NUL-terminated command line at cmdlineAddr.
func placeCmdline(mem []byte, cmdline string, limit uint64) error {
	if bytes.IndexByte([]byte(cmdline), 0) >= 0 {
		return errors.New("command line contains a NUL byte")
	}
	n := uint64(len(cmdline)) + 1
	if limit > maxCmdline {
		limit = maxCmdline
	}
	if n > limit {
		return fmt.Errorf("command line of %d bytes exceeds the kernel's limit of %d", n-1, limit-1)
	}
	copy(mem[cmdlineAddr:], cmdline)
	mem[cmdlineAddr+len(cmdline)] = 0
	return nil
}

// placeInitrd copies initrd to the highest page-aligned address such that it
// ends at or below min(limit, len(mem)) and starts at or above floor.
func placeInitrd(mem, initrd []byte, floor, limit uint64) (uint64, error) {
	if len(initrd) == 0 {
		return 0, nil
	}
	top := uint64(len(mem))
	if limit < top {
		top = limit
	}
	size := uint64(len(initrd))
	if size > top {
		return 0, fmt.Errorf("initrd of %d bytes does not fit below %#x", size, top)
	}
	addr := (top - size) &^ (pageSize - 1)
	if addr < floor {
		return 0, fmt.Errorf("initrd of %d bytes does not fit between the kernel end %#x and %#x", size, floor, top)
	}
	copy(mem[addr:], initrd)
	return addr, nil
}

// writeIdentityPageTables maps the first 4 GiB 1:1 with 2 MiB pages and
// returns the CR3 value.
func writeIdentityPageTables(mem []byte) uint64 {
	const (
		present = 1 << 0
		rw      = 1 << 1
		huge    = 1 << 7
	)
	pdpt := uint64(pml4Addr + pageSize)
	pd := pdpt + pageSize
	clear(mem[pml4Addr : pd+4*pageSize])
	le.PutUint64(mem[pml4Addr:], pdpt|present|rw)
	for i := uint64(0); i < 4; i++ {
		le.PutUint64(mem[pdpt+8*i:], (pd+i*pageSize)|present|rw)
		for j := uint64(0); j < 512; j++ {
			phys := (i*512 + j) << 21
			le.PutUint64(mem[pd+i*pageSize+8*j:], phys|present|rw|huge)
		}
	}
	return pml4Addr
}

// GDT selectors used at entry (those the Linux boot protocol documents).
const (
	selCode = 0x10
	selData = 0x18
	selTSS  = 0x20
)

// writeGDT writes a GDT with a null entry, a spare, flat code (64-bit when
// long), flat data and a TSS descriptor, and returns the segment values
// that match it.
func writeGDT(mem []byte, long bool) (code, data, tss Segment, gdt DTable) {
	code = Segment{Base: 0, Limit: 0xffffffff, Selector: selCode, Type: 0xb, Present: 1, S: 1, G: 1}
	if long {
		code.L = 1
	} else {
		code.DB = 1
	}
	data = Segment{Base: 0, Limit: 0xffffffff, Selector: selData, Type: 0x3, Present: 1, DB: 1, S: 1, G: 1}
	tss = Segment{Base: 0, Limit: 0x67, Selector: selTSS, Type: 0xb, Present: 1}
	entries := []uint64{0, 0, descriptor(code), descriptor(data), descriptor(tss), 0}
	for i, e := range entries {
		le.PutUint64(mem[gdtAddr+8*i:], e)
	}
	return code, data, tss, DTable{Base: gdtAddr, Limit: uint16(8*len(entries) - 1)}
}

// descriptor encodes a segment as an 8-byte GDT descriptor.
func descriptor(s Segment) uint64 {
	limit := uint64(s.Limit)
	if s.G == 1 {
		limit >>= 12
	}
	flags := uint64(s.Type) | uint64(s.S)<<4 | uint64(s.DPL)<<5 | uint64(s.Present)<<7 |
		uint64(s.AVL)<<12 | uint64(s.L)<<13 | uint64(s.DB)<<14 | uint64(s.G)<<15
	return limit&0xffff | (s.Base&0xffffff)<<16 | flags<<40 | (limit>>16&0xf)<<48 | (s.Base>>24&0xff)<<56
}
