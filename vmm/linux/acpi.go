package linux

import (
	"fmt"
	"sync"
)

// Minimal ACPI: an RSDP, an XSDT, a MADT listing the local APICs and the
// IOAPIC, and a FADT with a FACS and a DSDT whose only object is \_S5, so
// that Linux can power the machine off through the PM1 control register.
// Distribution kernels are often built without MP table support (Debian's
// is); without ACPI, Linux falls back to virtual-wire mode, which does not
// get far.
const (
	acpiBase   = 0xe0000 // RSDP here (Linux scans 0xe0000-0xfffff)
	xsdtAddr   = acpiBase + 0x40
	facsAddr   = acpiBase + 0x80 // 64-byte aligned
	fadtAddr   = acpiBase + 0x200
	madtAddr   = acpiBase + 0x400
	dsdtAddr   = acpiBase + 0x800 // room for virtio device objects
	acpiEnd    = mpAddr           // the MP table follows
	sdtHdrSize = 36

	sciIRQ = 9

	// PM1 register blocks, decoded by pmDevice.
	pm1EvtBase = 0x600 // PM1a_STS (2 bytes), PM1a_EN (2 bytes)
	pm1CntBase = 0x604 // PM1a_CNT (2 bytes)
	pmPorts    = 6

	pm1CntSCIEN   = 1 << 0
	pm1CntSlpEn   = 1 << 13
	pm1CntSlpTyp  = 7 << 10
	slpTypS5      = 5
	fadtFlagWBINV = 1 << 0
	fadtFlagPwrBt = 1 << 4 // no fixed power button
	fadtFlagSlpBt = 1 << 5 // no fixed sleep button
)

// s5AML is the DSDT body: Name (_S5, Package (4) {5, 5, 0, 0}), the
// sleep type values Linux writes to PM1a_CNT to power off.
var s5AML = []byte{0x08, '_', 'S', '5', '_', 0x12, 0x08, 0x04, 0x0a, slpTypS5, 0x0a, slpTypS5, 0x00, 0x00}

// writeACPI writes the tables for cpus processors and returns the RSDP's
// address.
func writeACPI(mem []byte, cpus int, virtio ...VirtioSlot) (uint64, error) {
	if cpus < 1 || cpus > maxMPCPUs {
		return 0, fmt.Errorf("ACPI tables: %d CPUs, want 1 to %d", cpus, maxMPCPUs)
	}
	if len(mem) < acpiEnd {
		return 0, fmt.Errorf("ACPI tables: guest RAM of %d bytes does not reach %#x", len(mem), acpiEnd)
	}

	madt := sdtHeader("APIC", 4)
	madt = le.AppendUint32(madt, lapicAddr)
	madt = le.AppendUint32(madt, 1) // PCAT_COMPAT: the 8259s are there too
	for i := 0; i < cpus; i++ {
		madt = append(madt, 0, 8, uint8(i), uint8(i)) // processor local APIC
		madt = le.AppendUint32(madt, 1)               // enabled
	}
	madt = append(madt, 1, 12, uint8(cpus), 0) // IOAPIC, ID after the CPUs
	madt = le.AppendUint32(madt, ioapicAddr)
	madt = le.AppendUint32(madt, 0) // GSI base
	// The SCI is ISA IRQ 9 on GSI 9, level-triggered, active high.
	madt = append(madt, 2, 10, 0, sciIRQ)
	madt = le.AppendUint32(madt, sciIRQ)
	madt = le.AppendUint16(madt, 0x1|0x3<<2)
	finishSDT(madt)

	dsdt := append(sdtHeader("DSDT", 2), s5AML...)
	dsdt = append(dsdt, virtioAML(virtio)...)
	finishSDT(dsdt)

	facs := make([]byte, 64)
	copy(facs, "FACS")
	le.PutUint32(facs[4:], 64)
	facs[32] = 2 // version

	fadt := sdtHeader("FACP", 6)
	fadt = append(fadt, make([]byte, 276-sdtHdrSize)...)
	le.PutUint32(fadt[36:], facsAddr)
	le.PutUint32(fadt[40:], dsdtAddr)
	le.PutUint16(fadt[46:], sciIRQ)
	// SMI_CMD (48) stays 0: the machine is always in ACPI mode.
	le.PutUint32(fadt[56:], pm1EvtBase)
	le.PutUint32(fadt[64:], pm1CntBase)
	fadt[88] = 4 // PM1_EVT_LEN
	fadt[89] = 2 // PM1_CNT_LEN
	fadt[108] = cmosCentury
	// IAPC_BOOT_ARCH (109) stays 0: no 8042, so Linux does not probe it.
	le.PutUint32(fadt[112:], fadtFlagWBINV|fadtFlagPwrBt|fadtFlagSlpBt)
	le.PutUint64(fadt[132:], facsAddr)
	le.PutUint64(fadt[140:], dsdtAddr)
	finishSDT(fadt)

	xsdt := sdtHeader("XSDT", 1)
	xsdt = le.AppendUint64(xsdt, fadtAddr)
	xsdt = le.AppendUint64(xsdt, madtAddr)
	finishSDT(xsdt)

	rsdp := make([]byte, 36)
	copy(rsdp, "RSD PTR ")
	copy(rsdp[9:], "TINE  ")
	rsdp[15] = 2 // ACPI 2.0+: use the XSDT
	le.PutUint32(rsdp[20:], uint32(len(rsdp)))
	le.PutUint64(rsdp[24:], xsdtAddr)
	rsdp[8] = checksum(rsdp[:20])
	rsdp[32] = checksum(rsdp)

	if madtAddr+len(madt) > dsdtAddr {
		return 0, fmt.Errorf("ACPI tables: MADT of %d bytes runs past %#x", len(madt), dsdtAddr)
	}
	if dsdtAddr+len(dsdt) > acpiEnd {
		return 0, fmt.Errorf("ACPI tables: DSDT of %d bytes (%d virtio devices) runs past %#x", len(dsdt), len(virtio), acpiEnd)
	}
	clear(mem[acpiBase:acpiEnd])
	for _, t := range []struct {
		addr int
		b    []byte
	}{{acpiBase, rsdp}, {xsdtAddr, xsdt}, {facsAddr, facs}, {dsdtAddr, dsdt}, {fadtAddr, fadt}, {madtAddr, madt}} {
		copy(mem[t.addr:], t.b)
	}
	return acpiBase, nil
}

// sdtHeader starts a system description table; finishSDT fills in its
// length and checksum.
func sdtHeader(sig string, rev uint8) []byte {
	h := make([]byte, sdtHdrSize)
	copy(h, sig)
	h[8] = rev
	copy(h[10:], "TINE  ")
	copy(h[16:], "TINEVMM ")
	le.PutUint32(h[24:], 1)
	copy(h[28:], "TINE")
	le.PutUint32(h[32:], 1)
	return h
}

func finishSDT(t []byte) {
	le.PutUint32(t[4:], uint32(len(t)))
	t[9] = 0
	t[9] = checksum(t)
}

// setRSDP tells the kernel where the RSDP is, for boot paths that carry
// it: boot_params.acpi_rsdp_addr (protocol 2.14+) or hvm_start_info's
// rsdp_paddr. Kernels also find it by scanning.
func (b *Boot) setRSDP(mem []byte, addr uint64) {
	switch b.Protocol {
	case ProtocolPVH:
		le.PutUint64(mem[bootInfoAddr+32:], addr)
	case ProtocolBzImage:
		le.PutUint64(mem[bootInfoAddr+bpACPIRSDPAddr:], addr)
	}
}

// pmDevice is the ACPI PM1a event and control register blocks. Status
// bits are write-one-to-clear, SCI_EN always reads as set (ACPI mode), and
// writing SLP_EN with sleep type S5 powers the machine off.
type pmDevice struct {
	mu       sync.Mutex
	sts, en  uint16
	cnt      uint16
	powerOff func()
}

func (p *pmDevice) In(port uint16, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	regs := p.bytes()
	for i := range data {
		off := int(port) - pm1EvtBase + i
		data[i] = 0xff
		if off >= 0 && off < len(regs) {
			data[i] = regs[off]
		}
	}
}

func (p *pmDevice) Out(port uint16, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	regs := p.bytes()
	off := int(port) - pm1EvtBase
	var sts uint16
	for i, b := range data {
		o := off + i
		if o < 0 || o >= len(regs) {
			continue
		}
		switch {
		case o < 2:
			sts |= uint16(b) << (8 * o)
		default:
			regs[o] = b
		}
	}
	p.sts &^= sts
	p.en = le.Uint16(regs[2:])
	p.cnt = le.Uint16(regs[4:]) &^ pm1CntSlpEn
	cnt := le.Uint16(regs[4:])
	if cnt&pm1CntSlpEn != 0 && (cnt&pm1CntSlpTyp)>>10 == slpTypS5 && p.powerOff != nil {
		p.powerOff()
	}
}

// bytes returns the six register bytes: PM1a_STS, PM1a_EN, PM1a_CNT.
func (p *pmDevice) bytes() []byte {
	b := make([]byte, pmPorts)
	le.PutUint16(b, p.sts)
	le.PutUint16(b[2:], p.en)
	le.PutUint16(b[4:], p.cnt|pm1CntSCIEN)
	return b
}
