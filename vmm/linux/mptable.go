package linux

import "fmt"

// An Intel MultiProcessor Specification 1.4 table tells a kernel without
// ACPI how many CPUs there are and how ISA interrupts reach the IOAPIC.
const (
	mpAddr     = 0xf0000 // floating pointer; the config table follows it
	mpTableMax = 0x10000 // the BIOS area Linux scans, 0xf0000-0xfffff
	maxMPCPUs  = 64
	lapicAddr  = 0xfee00000
	ioapicAddr = 0xfec00000
	ioapicPins = 24
	isaIRQs    = 16
)

// MP table entry types and flags.
const (
	mpProcessor = 0
	mpBus       = 1
	mpIOAPIC    = 2
	mpIOInt     = 3
	mpLocalInt  = 4

	mpCPUEnabled = 1
	mpCPUBoot    = 2
	mpIntINT     = 0
	mpIntNMI     = 1
	mpIntExtINT  = 3
)

// writeMPTable writes an MP floating pointer and configuration table for
// cpus processors (APIC IDs 0..cpus-1), one ISA bus and the IOAPIC, with
// ISA IRQ n wired to IOAPIC pin n, at 0xf0000.
func writeMPTable(mem []byte, cpus int) error {
	if cpus < 1 || cpus > maxMPCPUs {
		return fmt.Errorf("MP table: %d CPUs, want 1 to %d", cpus, maxMPCPUs)
	}
	if len(mem) < mpAddr+mpTableMax {
		return fmt.Errorf("MP table: guest RAM of %d bytes does not reach %#x", len(mem), mpAddr+mpTableMax)
	}
	ioapicID := uint8(cpus)
	var t []byte
	put16 := func(v uint16) { t = le.AppendUint16(t, v) }
	put32 := func(v uint32) { t = le.AppendUint32(t, v) }

	// Configuration table header; length, count and checksum patched below.
	t = append(t, "PCMP"...)
	put16(0)
	t = append(t, 4, 0)
	t = append(t, "TINE    "...)
	t = append(t, "TINE VMM    "...)
	put32(0)
	put16(0)
	put16(0)
	put32(lapicAddr)
	put16(0)
	t = append(t, 0, 0)
	count := 0
	for i := 0; i < cpus; i++ {
		flags := uint8(mpCPUEnabled)
		if i == 0 {
			flags |= mpCPUBoot
		}
		t = append(t, mpProcessor, uint8(i), 0x14, flags)
		put32(0x600) // family 6 signature
		put32(0x201) // FPU, APIC
		t = append(t, make([]byte, 8)...)
		count++
	}
	t = append(t, mpBus, 0)
	t = append(t, "ISA   "...)
	count++
	t = append(t, mpIOAPIC, ioapicID, 0x11, 1)
	put32(ioapicAddr)
	count++
	for irq := 0; irq < isaIRQs; irq++ {
		t = append(t, mpIOInt, mpIntINT)
		put16(0) // polarity and trigger conform to the bus
		t = append(t, 0, uint8(irq), ioapicID, uint8(irq))
		count++
	}
	t = append(t, mpLocalInt, mpIntExtINT)
	put16(0)
	t = append(t, 0, 0, 0xff, 0)
	t = append(t, mpLocalInt, mpIntNMI)
	put16(0)
	t = append(t, 0, 0, 0xff, 1)
	count += 2
	le.PutUint16(t[4:], uint16(len(t)))
	le.PutUint16(t[34:], uint16(count))
	t[7] = checksum(t)

	fp := make([]byte, 16)
	copy(fp, "_MP_")
	le.PutUint32(fp[4:], mpAddr+16)
	fp[8] = 1 // length in 16-byte units
	fp[9] = 4 // spec revision 1.4
	fp[10] = checksum(fp)
	copy(mem[mpAddr:], fp)
	copy(mem[mpAddr+16:], t)
	return nil
}

// checksum returns the byte that makes b sum to zero (its slot must be 0).
func checksum(b []byte) uint8 {
	var s uint8
	for _, x := range b {
		s += x
	}
	return -s
}
