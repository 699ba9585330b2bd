package linux

import "fmt"

// Minimal ACPI tables: an RSDP, an XSDT and a MADT that lists the local
// APICs and the IOAPIC. Distribution kernels are often built without MP
// table support (Debian's is), and without either table Linux falls back
// to virtual-wire mode, which does not get far. There is no FADT or DSDT:
// Linux parses the MADT early, then gives up on the ACPI interpreter and
// carries on with legacy devices, which is what this machine has.
const (
	acpiBase   = 0xe0000 // RSDP here (Linux scans 0xe0000-0xfffff)
	xsdtAddr   = acpiBase + 0x40
	madtAddr   = acpiBase + 0x100
	acpiEnd    = mpAddr // the MP table follows
	sdtHdrSize = 36
)

// writeACPI writes the tables for cpus processors and returns the RSDP's
// address.
func writeACPI(mem []byte, cpus int) (uint64, error) {
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
	finishSDT(madt)

	xsdt := sdtHeader("XSDT", 1)
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

	if madtAddr+len(madt) > acpiEnd {
		return 0, fmt.Errorf("ACPI tables: MADT of %d bytes runs past %#x", len(madt), acpiEnd)
	}
	clear(mem[acpiBase:acpiEnd])
	copy(mem[acpiBase:], rsdp)
	copy(mem[xsdtAddr:], xsdt)
	copy(mem[madtAddr:], madt)
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
