package serial

import (
	"bytes"
	"reflect"
	"testing"

	"tine/internal/fuzzbytes"
)

// Operation kinds, in the low two bits of an operation's first byte.
const (
	fuzzIn      = 0
	fuzzOut     = 1
	fuzzReceive = 2 // host input arrives on the line
	fuzzClone   = 3 // the machine forks or is saved and restored
)

// maxFuzzOps bounds the operations of one input.
const maxFuzzOps = 256

// fuzzSizes are the access sizes an operation picks from: the valid ones,
// an empty access and odd ones.
var fuzzSizes = [8]int{1, 2, 4, 1, 0, 3, 8, 1}

// wantIRQ is the interrupt level a state calls for.
func wantIRQ(s State) bool {
	return s.IER&ierRDI != 0 && len(s.RX) > 0 || s.IER&ierTHRI != 0 && s.THRI
}

// wantIn is what a one-byte read of register off returns in state s.
func wantIn(s State, off uint16) byte {
	dlab := s.LCR&lcrDLAB != 0
	switch off {
	case regData:
		if dlab {
			return s.DLL
		}
		if len(s.RX) > 0 {
			return s.RX[0]
		}
		return 0
	case regIER:
		if dlab {
			return s.DLM
		}
		return s.IER
	case regIIR:
		iir := byte(iirNone)
		if s.IER&ierRDI != 0 && len(s.RX) > 0 {
			iir = iirRDI
		} else if s.IER&ierTHRI != 0 && s.THRI {
			iir = iirTHRI
		}
		if s.FCR&fcrEnable != 0 {
			iir |= iirFIFOOn
		}
		return iir
	case regLCR:
		return s.LCR
	case regMCR:
		return s.MCR
	case regLSR:
		if len(s.RX) > 0 {
			return lsrTHRE | lsrTEMT | lsrDR
		}
		return lsrTHRE | lsrTEMT
	case regMSR:
		if s.MCR&mcrLoop == 0 {
			return s.MSR
		}
		m := byte(0)
		for _, l := range [][2]byte{{mcrDTR, msrDSR}, {mcrRTS, msrCTS}, {mcrOUT1, msrRI}, {mcrOUT2, msrDCD}} {
			if s.MCR&l[0] != 0 {
				m |= l[1]
			}
		}
		return m
	case regSCR:
		return s.SCR
	}
	return 0xff
}

// FuzzUARTPorts feeds a UART a sequence of at most maxFuzzOps operations:
// port reads and writes of any size (including empty and odd ones) at its
// registers, around them or at any port; host input; clones and
// save/restore round trips. It asserts that nothing panics, that a
// one-byte read returns what the 16550 model says and bytes outside the
// UART's ports read 0xff, that a transmitted byte reaches the output
// exactly when it should, that pending input stays within MaxRX, and
// that the interrupt line changes only on edges and follows the pending
// conditions.
func FuzzUARTPorts(f *testing.F) {
	out := func(off, v byte) []byte { return []byte{fuzzOut, off + 4, v} }
	in := func(off byte) []byte { return []byte{fuzzIn, off + 4} }
	join := func(ops ...[]byte) []byte { return bytes.Join(ops, nil) }
	// Linux's 8250 probe and setup: 115200 8N1, FIFO on, modem lines,
	// interrupts; then a line of output and input read back.
	f.Add(join(out(regLCR, lcrDLAB), out(regData, 1), out(regIER, 0), out(regLCR, 3),
		out(regIIR, 0xc7), out(regMCR, mcrDTR|mcrRTS|mcrOUT2), out(regIER, ierRDI|ierTHRI),
		in(regIIR), in(regLSR), out(regData, 'h'), out(regData, 'i'), in(regIIR),
		[]byte{fuzzReceive, 2, 'o', 'k'}, in(regIIR), in(regData), in(regData), in(regLSR)))
	// Loopback test and scratch register, then a fork.
	f.Add(join(out(regMCR, mcrLoop|mcrOUT1), out(regData, 0x5a), in(regLSR), in(regData), in(regMSR),
		out(regSCR, 0xa5), in(regSCR), []byte{fuzzClone, fuzzClone | 1<<2}, in(regSCR)))
	// Wide and odd accesses, around the ports and far off.
	f.Add([]byte{fuzzOut | 2<<2, 2, 1, 2, 3, 4, fuzzIn | 6<<2, 0, fuzzIn | 5<<2 | 1<<5, 0xff, 0xff,
		fuzzOut | 1<<2 | 1<<5, 0xfe, 0x03, 9, 9, fuzzIn | 4<<2, 4})
	f.Fuzz(func(t *testing.T, data []byte) {
		var output bytes.Buffer
		level := false
		cfg := Config{Base: COM1Base, Out: &output, IRQ: func(high bool) {
			if high == level {
				t.Fatalf("interrupt line set to %v twice", high)
			}
			level = high
		}}
		u := New(cfg)
		r := fuzzbytes.New(data)
		var p [8]byte
		for n := 0; n < maxFuzzOps && r.Len() > 0; n++ {
			op := r.Byte()
			size := fuzzSizes[op>>2&7]
			var port uint16
			if op&3 == fuzzIn || op&3 == fuzzOut {
				port = COM1Base - 4 + uint16(r.Byte()%16)
				if op&(1<<5) != 0 {
					port = uint16(r.Byte())<<8 | port&0xff
				}
			}
			before := u.State()
			sent := output.Len()
			switch op & 3 {
			case fuzzIn:
				b := p[:size]
				for i := range b {
					b[i] = 0xee
				}
				u.In(port, b)
				for i, v := range b {
					off := port - COM1Base + uint16(i)
					if off >= Ports && v != 0xff || i == 0 && v != wantIn(before, off) {
						t.Fatalf("read of %d bytes at %#x: byte %d is %#x (state %+v)", size, port, i, v, before)
					}
				}
			case fuzzOut:
				b := p[:size]
				clear(b)
				copy(b, r.Take(size))
				u.Out(port, b)
				if output.Len()-sent > size {
					t.Fatalf("%d bytes written, %d sent", size, output.Len()-sent)
				}
				if size == 1 && port == COM1Base && before.LCR&lcrDLAB == 0 {
					after := u.State()
					switch {
					case before.MCR&mcrLoop != 0:
						if output.Len() != sent || len(before.RX) < MaxRX && !bytes.Equal(after.RX, append(before.RX, b[0])) {
							t.Fatalf("loopback byte %#x: output %d, input %q then %q", b[0], output.Len()-sent, before.RX, after.RX)
						}
					case output.Len() != sent+1 || output.Bytes()[sent] != b[0]:
						t.Fatalf("byte %#x not transmitted", b[0])
					}
				}
			case fuzzReceive:
				b := r.Take(int(r.Byte()))
				k := u.Receive(b)
				if want := min(len(b), MaxRX-len(before.RX)); k != want {
					t.Fatalf("Receive kept %d of %d with %d pending", k, len(b), len(before.RX))
				}
			case fuzzClone:
				if op&(1<<2) != 0 {
					u = u.Clone(cfg)
				} else {
					u = NewFromState(cfg, before)
				}
				if s := u.State(); !reflect.DeepEqual(s, before) {
					t.Fatalf("state %+v became %+v", before, s)
				}
			}
			s := u.State()
			if len(s.RX) > MaxRX || s.IER > 0x0f || s.MCR > 0x1f {
				t.Fatalf("state out of range: IER %#x MCR %#x, %d bytes pending", s.IER, s.MCR, len(s.RX))
			}
			if s.IRQHigh != wantIRQ(s) || s.IRQHigh != level {
				t.Fatalf("interrupt line %v (last edge %v) in state %+v", s.IRQHigh, level, s)
			}
		}
	})
}
