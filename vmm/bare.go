package vmm

import (
	"encoding/binary"
	"fmt"
)

// Bare-guest memory layout (guest-physical = guest-virtual, identity
// mapped). A bare guest is a flat program loaded at BareEntry and entered
// in 64-bit mode at CPL3 with IOPL=3, RSP just below BareEntry, RDI =
// RAM size and interrupts off.
const (
	bareGDT        = 0x1000
	bareIDT        = 0x2000
	bareTSS        = 0x7000
	bareStubs      = 0x4000 // 256 exception stubs of 16 bytes, CPL0
	bareKStackTop  = 0x6000 // RSP0 for exceptions
	barePML4       = 0x10000
	barePDPT       = 0x11000
	barePD         = 0x12000 // one page per GiB
	bareMaxGiB     = 64
	BareEntry      = 0x100000 // where the program is loaded and entered
	BareStackTop   = BareEntry - 8
	bareMinMemSize = 2 << 20

	selKernelCode = 0x08
	selUserData   = 0x18 | 3
	selUserCode   = 0x20 | 3
	selTSS        = 0x28
)

// LoadBare prepares a single-vCPU VM to run a bare guest: it writes the
// GDT, IDT, TSS, exception stubs, identity page tables with the user bit
// (RAM plus one GiB above it, so stray accesses reach the VMM as MMIO),
// copies program to BareEntry and sets vCPU 0's registers for a CPL3
// 64-bit entry. It is correct on VMX and SVM hosts as on PVM.
func (vm *VM) LoadBare(program []byte) error {
	size := vm.cfg.MemSize
	if len(vm.vcpus) != 1 {
		return fmt.Errorf("vmm: bare guests run on 1 vCPU, VM has %d", len(vm.vcpus))
	}
	if size < bareMinMemSize {
		return fmt.Errorf("vmm: bare guest needs at least %d bytes of RAM, VM has %d", bareMinMemSize, size)
	}
	if uint64(len(program)) > size-BareEntry {
		return fmt.Errorf("vmm: bare program of %d bytes does not fit in %d bytes of RAM", len(program), size)
	}
	gib := (size+(1<<30)-1)>>30 + 1
	if gib > bareMaxGiB {
		return fmt.Errorf("vmm: bare guests map at most %d GiB, VM has %d bytes", bareMaxGiB-1, size)
	}
	m := vm.mem
	le := binary.LittleEndian

	// GDT: null, kernel code, kernel data, user data, user code, TSS.
	gdt := []uint64{
		0,
		0x00af9a000000ffff, // 0x08 kernel code, 64-bit
		0x00cf92000000ffff, // 0x10 kernel data
		0x00cff2000000ffff, // 0x18 user data, DPL3
		0x00affa000000ffff, // 0x20 user code, 64-bit, DPL3
	}
	for i, d := range gdt {
		le.PutUint64(m[bareGDT+8*i:], d)
	}
	const tssLimit = 0x68 + 8192
	tssLo := uint64(tssLimit) | uint64(bareTSS&0xffffff)<<16 | uint64(0x89)<<40 | uint64(bareTSS>>24&0xff)<<56
	le.PutUint64(m[bareGDT+selTSS:], tssLo)
	le.PutUint64(m[bareGDT+selTSS+8:], 0)

	// TSS: RSP0 for exceptions taken from CPL3; no I/O bitmap.
	clear(m[bareTSS : bareTSS+tssLimit+1])
	m[bareTSS+tssLimit] = 0xff
	le.PutUint64(m[bareTSS+4:], bareKStackTop)
	le.PutUint16(m[bareTSS+0x66:], 0x68)

	// Exception stubs: mov eax, vector; mov dx, PortFault; out dx, eax;
	// hlt; jmp back to hlt. IDT: interrupt gates to them at CPL0.
	for v := range 256 {
		stub := m[bareStubs+16*v : bareStubs+16*v+16]
		copy(stub, []byte{0xb8, byte(v), 0, 0, 0, 0x66, 0xba, byte(PortFault & 0xff), byte(PortFault >> 8), 0xef, 0xf4, 0xeb, 0xfd, 0x90, 0x90, 0x90})
		addr := uint64(bareStubs + 16*v)
		gate := m[bareIDT+16*v : bareIDT+16*v+16]
		le.PutUint16(gate[0:], uint16(addr))
		le.PutUint16(gate[2:], selKernelCode)
		gate[4] = 0
		gate[5] = 0x8e
		le.PutUint16(gate[6:], uint16(addr>>16))
		le.PutUint32(gate[8:], uint32(addr>>32))
		le.PutUint32(gate[12:], 0)
	}

	// Identity map with 2 MiB pages, user-accessible. Accessed and dirty
	// bits are set up front so that the CPU never writes the page tables:
	// a forked child then shares them with its image instead of copying
	// each on its first memory access.
	const present, accessed, dirty, large = 0x7, 0x20, 0x40, 0x80
	clear(m[barePML4 : barePML4+0x2000])
	le.PutUint64(m[barePML4:], barePDPT|present|accessed)
	for g := range gib {
		pd := uint64(barePD) + g*0x1000
		le.PutUint64(m[barePDPT+8*g:], pd|present|accessed)
		for j := range uint64(512) {
			le.PutUint64(m[pd+8*j:], (g<<30+j<<21)|present|accessed|dirty|large)
		}
	}

	copy(m[BareEntry:], program)

	c := vm.vcpus[0]
	s, err := c.Sregs()
	if err != nil {
		return err
	}
	code := Segment{Base: 0, Limit: 0xffffffff, Selector: selUserCode, Typ: 0xb, Present: 1, DPL: 3, S: 1, L: 1, G: 1}
	data := Segment{Base: 0, Limit: 0xffffffff, Selector: selUserData, Typ: 0x3, Present: 1, DPL: 3, DB: 1, S: 1, G: 1}
	s.CS = code
	s.DS, s.ES, s.FS, s.GS, s.SS = data, data, data, data, data
	s.TR = Segment{Base: bareTSS, Limit: tssLimit, Selector: selTSS, Typ: 0xb, Present: 1}
	s.LDT = Segment{Typ: 2, Unusable: 1}
	s.GDT = Descriptor{Base: bareGDT, Limit: uint16(selTSS + 16 - 1)}
	s.IDT = Descriptor{Base: bareIDT, Limit: 256*16 - 1}
	s.CR0 = 0x80050033             // PG AM WP NE ET MP PE
	s.CR4 = 0x20 | 0x600           // PAE OSFXSR OSXMMEXCPT
	s.EFER = 0x100 | 0x400 | 0x800 // LME LMA NXE
	s.CR3 = barePML4
	if err := c.SetSregs(s); err != nil {
		return err
	}
	// Turn on XSAVE with AVX when the vCPU allows it, so that compiled
	// guests may use vector registers.
	s.CR4 |= 0x40000 // OSXSAVE
	if err := c.SetSregs(s); err == nil {
		if c.SetXCR0(7) != nil && c.SetXCR0(3) != nil {
			s.CR4 &^= 0x40000
			if err := c.SetSregs(s); err != nil {
				return err
			}
		}
	}
	return c.SetRegs(&Regs{RIP: BareEntry, RSP: BareStackTop, RFLAGS: 0x3002, RDI: size})
}

// exceptionFault describes an exception a bare guest's stub reported: the
// vector and, from the exception frame on the kernel stack, the faulting
// instruction (every read is bounds-checked against RAM).
func (c *VCPU) exceptionFault(vector uint32) error {
	e := &GuestError{VCPU: c.id, Err: ErrGuestException}
	detail := fmt.Sprintf("vector %d", vector)
	r, err := c.Regs()
	if err != nil {
		e.Detail = detail
		return e
	}
	frame := r.RSP
	switch vector {
	case 8, 10, 11, 12, 13, 14, 17, 21, 29, 30:
		if code, ok := c.vm.guestU64(frame); ok {
			detail += fmt.Sprintf(" error code %#x", code)
		}
		frame += 8
	}
	if rip, ok := c.vm.guestU64(frame); ok {
		e.RIP = rip
	} else {
		e.RIP = r.RIP
		detail += fmt.Sprintf(" (exception frame at %#x outside RAM)", frame)
	}
	if vector == 14 {
		if s, err := c.Sregs(); err == nil {
			detail += fmt.Sprintf(" address %#x", s.CR2)
		}
	}
	e.Detail = detail
	return e
}

// guestU64 reads 8 bytes of guest-physical memory, if they lie in RAM.
func (vm *VM) guestU64(addr uint64) (uint64, bool) {
	if addr > vm.cfg.MemSize || vm.cfg.MemSize-addr < 8 {
		return 0, false
	}
	return binary.LittleEndian.Uint64(vm.mem[addr:]), true
}
