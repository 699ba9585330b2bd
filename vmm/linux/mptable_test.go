package linux

import (
	"bytes"
	"testing"
)

func sum8(b []byte) uint8 {
	var s uint8
	for _, x := range b {
		s += x
	}
	return s
}

// TestMPTable checks the table the way Linux's mpparse does: it scans
// 0xf0000-0xfffff for the floating pointer on 16-byte boundaries, checks
// both checksums, and counts the processor entries.
func TestMPTable(t *testing.T) {
	for _, cpus := range []int{1, 2, 64} {
		mem := make([]byte, 2<<20)
		if err := writeMPTable(mem, cpus); err != nil {
			t.Fatal(err)
		}
		fpAt := -1
		for a := 0xf0000; a < 0x100000; a += 16 {
			if bytes.Equal(mem[a:a+4], []byte("_MP_")) && mem[a+8] == 1 && sum8(mem[a:a+16]) == 0 && (mem[a+9] == 1 || mem[a+9] == 4) {
				fpAt = a
				break
			}
		}
		if fpAt < 0 {
			t.Fatalf("%d CPUs: no valid floating pointer in the BIOS area", cpus)
		}
		ct := mem[le.Uint32(mem[fpAt+4:]):]
		n := le.Uint16(ct[4:])
		if string(ct[:4]) != "PCMP" || sum8(ct[:n]) != 0 || le.Uint32(ct[36:]) != lapicAddr {
			t.Fatalf("%d CPUs: bad config table header % x", cpus, ct[:44])
		}
		procs, ioapics, ints := 0, 0, 0
		e := ct[44:n]
		for i := 0; i < int(le.Uint16(ct[34:])); i++ {
			switch e[0] {
			case mpProcessor:
				procs++
				if (e[3]&mpCPUBoot != 0) != (e[1] == 0) {
					t.Fatalf("CPU %d boot flag %#x", e[1], e[3])
				}
				e = e[20:]
			case mpIOAPIC:
				ioapics++
				e = e[8:]
			case mpIOInt:
				ints++
				e = e[8:]
			default:
				e = e[8:]
			}
		}
		if len(e) != 0 || procs != cpus || ioapics != 1 || ints != isaIRQs {
			t.Fatalf("%d CPUs: %d left over bytes, %d processors, %d IOAPICs, %d interrupts", cpus, len(e), procs, ioapics, ints)
		}
	}
	if err := writeMPTable(make([]byte, 0xf8000), 1); err == nil {
		t.Fatal("wrote an MP table past the end of 1 MiB of RAM")
	}
}
