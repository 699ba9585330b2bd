package linux

import (
	"bytes"
	"testing"
	"time"
)

func inb(d interface{ In(uint16, []byte) }, port uint16) uint8 {
	b := []byte{0}
	d.In(port, b)
	return b[0]
}

func TestCMOS(t *testing.T) {
	c := newCMOS()
	c.now = func() time.Time { return time.Date(2026, 11, 21, 23, 45, 7, 0, time.UTC) }
	tests := []struct {
		reg  uint8
		want uint8
	}{
		// BCD, as x86 Linux reads it (binary here read as BCD put the
		// guest's clock in 2020).
		{cmosSeconds, 0x07}, {cmosMinutes, 0x45}, {cmosHours, 0x23}, {cmosDay, 0x21}, {cmosMonth, 0x11},
		{cmosYear, 0x26}, {cmosCentury, 0x20}, {cmosWeekday, 7}, // a Saturday
		{cmosStatusA, 0x26}, {cmosStatusB, cmosHour24}, {cmosStatusD, cmosValid},
	}
	for _, tc := range tests {
		c.Out(cmosBase, []byte{tc.reg | 0x80}) // with the NMI mask bit
		if got := inb(c, cmosBase+1); got != tc.want {
			t.Errorf("register %#x = %d, want %d", tc.reg, got, tc.want)
		}
	}
	c.Out(cmosBase, []byte{0x40})
	c.Out(cmosBase+1, []byte{0x5a})
	if got := inb(c, cmosBase+1); got != 0x5a {
		t.Errorf("CMOS RAM byte %#x, want 0x5a", got)
	}
	c.Out(cmosBase, []byte{cmosStatusB})
	c.Out(cmosBase+1, []byte{0})
	if got := inb(c, cmosBase+1); got != cmosHour24 {
		t.Errorf("status B %#x after a 12-hour write, want 24-hour kept", got)
	}
	// A guest that asks for binary gets binary.
	c.Out(cmosBase+1, []byte{cmosBinary})
	c.Out(cmosBase, []byte{cmosYear})
	if got := inb(c, cmosBase+1); got != 26 {
		t.Errorf("year in binary mode = %d, want 26", got)
	}
}

func TestI8042AndEmptyBus(t *testing.T) {
	resets := 0
	k := &i8042{reset: func() { resets++ }}
	if s := inb(k, i8042Command); s&0x02 != 0 || s&i8042StatusOBF == 0 {
		t.Fatalf("status %#x: want input buffer empty, output full", s)
	}
	k.Out(i8042Command, []byte{0xaa})
	if resets != 0 {
		t.Fatal("self-test command reset the machine")
	}
	k.Out(i8042Command, []byte{i8042Reset})
	if resets != 1 {
		t.Fatal("0xfe on port 0x64 did not reset the machine")
	}
	b := []byte{0, 0, 0, 0}
	emptyBus{}.In(0xcfc, b)
	if !bytes.Equal(b, []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Fatalf("empty bus read % x", b)
	}
}

func TestPMPowerOff(t *testing.T) {
	offs := 0
	p := &pmDevice{powerOff: func() { offs++ }}
	cnt := func() uint16 { b := make([]byte, 2); p.In(pm1CntBase, b); return le.Uint16(b) }
	if cnt()&pm1CntSCIEN == 0 {
		t.Fatal("SCI_EN reads clear: Linux would think ACPI mode is off")
	}
	p.Out(pm1CntBase, le.AppendUint16(nil, 3<<10|pm1CntSlpEn)) // S3 is not power-off
	if offs != 0 {
		t.Fatal("sleep type 3 powered off")
	}
	p.Out(pm1CntBase, le.AppendUint16(nil, slpTypS5<<10))
	if offs != 0 || (cnt()&pm1CntSlpTyp)>>10 != slpTypS5 {
		t.Fatalf("writing SLP_TYP alone: %d power-offs, PM1_CNT %#x", offs, cnt())
	}
	p.Out(pm1CntBase, le.AppendUint16(nil, slpTypS5<<10|pm1CntSlpEn))
	if offs != 1 {
		t.Fatal("SLP_EN with S5 did not power off")
	}
	p.sts = 0x8001
	p.Out(pm1EvtBase, []byte{0x01, 0x00})
	if p.sts != 0x8000 {
		t.Fatalf("PM1_STS %#x after clearing bit 0, want 0x8000", p.sts)
	}
}

// TestACPITables checks the tables as an OS reads them: the RSDP found by
// scanning, checksums on every table, the XSDT's pointers, the MADT's
// processors and IOAPIC, and the DSDT's \_S5 object.
func TestACPITables(t *testing.T) {
	mem := make([]byte, 2<<20)
	rsdpAt, err := writeACPI(mem, 3)
	if err != nil {
		t.Fatal(err)
	}
	found := -1
	for a := 0xe0000; a < 0x100000; a += 16 {
		if string(mem[a:a+8]) == "RSD PTR " && sum8(mem[a:a+20]) == 0 && sum8(mem[a:a+36]) == 0 {
			found = a
			break
		}
	}
	if found != int(rsdpAt) {
		t.Fatalf("RSDP found by scanning at %#x, written at %#x", found, rsdpAt)
	}
	table := func(addr uint64, sig string) []byte {
		t.Helper()
		n := le.Uint32(mem[addr+4:])
		tb := mem[addr : addr+uint64(n)]
		if string(tb[:4]) != sig || sum8(tb) != 0 {
			t.Fatalf("table at %#x: signature %q, checksum %#x", addr, tb[:4], sum8(tb))
		}
		return tb
	}
	xsdt := table(le.Uint64(mem[rsdpAt+24:]), "XSDT")
	sigs := map[string]uint64{}
	for p := xsdt[sdtHdrSize:]; len(p) >= 8; p = p[8:] {
		a := le.Uint64(p)
		sigs[string(mem[a:a+4])] = a
	}
	madt := table(sigs["APIC"], "APIC")
	cpus, ioapics, overrides := 0, 0, 0
	for e := madt[44:]; len(e) > 0; e = e[e[1]:] {
		switch e[0] {
		case 0:
			cpus++
		case 1:
			ioapics++
		case 2:
			overrides++
		}
	}
	if cpus != 3 || ioapics != 1 || overrides != 1 {
		t.Fatalf("MADT: %d CPUs, %d IOAPICs, %d overrides", cpus, ioapics, overrides)
	}
	fadt := table(sigs["FACP"], "FACP")
	dsdt := table(uint64(le.Uint32(fadt[40:])), "DSDT")
	if !bytes.Contains(dsdt, []byte("_S5_")) {
		t.Fatal("DSDT has no \\_S5 object")
	}
	if le.Uint32(fadt[64:]) != pm1CntBase || le.Uint16(fadt[46:]) != sciIRQ {
		t.Fatalf("FADT PM1a_CNT %#x SCI %d", le.Uint32(fadt[64:]), le.Uint16(fadt[46:]))
	}
	if facs := mem[le.Uint32(fadt[36:]):]; string(facs[:4]) != "FACS" || le.Uint32(fadt[36:])%64 != 0 {
		t.Fatal("FACS missing or not 64-byte aligned")
	}
}
