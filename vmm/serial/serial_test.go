package serial

import (
	"bytes"
	"testing"
)

type rig struct {
	u     *UART
	out   bytes.Buffer
	edges []bool
}

func newRig() *rig {
	r := &rig{}
	r.u = New(Config{Base: COM1Base, Out: &r.out, IRQ: func(h bool) { r.edges = append(r.edges, h) }})
	return r
}

func (r *rig) in(off uint16) uint8 {
	b := []byte{0}
	r.u.In(COM1Base+off, b)
	return b[0]
}

func (r *rig) out1(off uint16, v uint8) { r.u.Out(COM1Base+off, []byte{v}) }

func TestRegisters(t *testing.T) {
	tests := []struct {
		name string
		run  func(r *rig) (got, want uint8)
	}{
		{"LSR reports an empty transmitter", func(r *rig) (uint8, uint8) { return r.in(regLSR), lsrTHRE | lsrTEMT }},
		{"IIR with nothing pending", func(r *rig) (uint8, uint8) { return r.in(regIIR), iirNone }},
		{"IIR shows the FIFO once enabled", func(r *rig) (uint8, uint8) { r.out1(regIIR, fcrEnable); return r.in(regIIR), iirNone | iirFIFOOn }},
		{"scratch register keeps its value", func(r *rig) (uint8, uint8) { r.out1(regSCR, 0xa5); return r.in(regSCR), 0xa5 }},
		{"IER keeps the low nibble", func(r *rig) (uint8, uint8) { r.out1(regIER, 0xff); return r.in(regIER), 0x0f }},
		{"DLAB selects DLL", func(r *rig) (uint8, uint8) {
			r.out1(regLCR, lcrDLAB)
			r.out1(regData, 0x0c)
			r.out1(regIER, 0x00)
			r.out1(regLCR, 0x03)
			r.out1(regLCR, lcrDLAB)
			return r.in(regData), 0x0c
		}},
		{"DLAB hides IER", func(r *rig) (uint8, uint8) {
			r.out1(regIER, 0x05)
			r.out1(regLCR, lcrDLAB)
			r.out1(regIER, 0x01)
			r.out1(regLCR, 0x03)
			return r.in(regIER), 0x05
		}},
		{"loopback wires RTS and OUT2 to CTS and DCD", func(r *rig) (uint8, uint8) {
			r.out1(regMCR, mcrLoop|mcrRTS|mcrOUT2)
			return r.in(regMSR) & 0xf0, 0x90
		}},
		{"loopback echoes THR into RBR", func(r *rig) (uint8, uint8) {
			r.out1(regMCR, mcrLoop)
			r.out1(regData, 'z')
			if r.in(regLSR)&lsrDR == 0 {
				return 0, 1
			}
			return r.in(regData), 'z'
		}},
		{"MSR reports a peer outside loopback", func(r *rig) (uint8, uint8) { return r.in(regMSR), msrDCD | msrDSR | msrCTS }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig()
			if got, want := tc.run(r); got != want {
				t.Fatalf("got %#x, want %#x", got, want)
			}
		})
	}
}

func TestTransmit(t *testing.T) {
	r := newRig()
	for _, b := range []byte("Linux version") {
		r.out1(regData, b)
	}
	if r.out.String() != "Linux version" {
		t.Fatalf("output %q", r.out.String())
	}
	r.out1(regMCR, mcrLoop)
	r.out1(regData, '!')
	if r.out.String() != "Linux version" {
		t.Fatalf("loopback byte leaked to output: %q", r.out.String())
	}
}

func TestTHREInterrupt(t *testing.T) {
	r := newRig()
	r.out1(regIER, ierTHRI)
	if len(r.edges) != 1 || !r.edges[0] {
		t.Fatalf("enabling THRI: edges %v, want [true]", r.edges)
	}
	if iir := r.in(regIIR); iir != iirTHRI {
		t.Fatalf("IIR %#x, want THRI", iir)
	}
	if len(r.edges) != 2 || r.edges[1] {
		t.Fatalf("reading IIR did not lower the line: %v", r.edges)
	}
	if iir := r.in(regIIR); iir != iirNone {
		t.Fatalf("second IIR read %#x, want none pending", iir)
	}
	r.out1(regData, 'a')
	if len(r.edges) != 3 || !r.edges[2] {
		t.Fatalf("THR write did not raise the line again: %v", r.edges)
	}
	r.out1(regIER, 0)
	if len(r.edges) != 4 || r.edges[3] {
		t.Fatalf("disabling THRI did not lower the line: %v", r.edges)
	}
}

func TestReceive(t *testing.T) {
	r := newRig()
	if n := r.u.Receive([]byte("hi")); n != 2 {
		t.Fatalf("Receive kept %d bytes", n)
	}
	if len(r.edges) != 0 {
		t.Fatalf("IRQ raised with RDI disabled: %v", r.edges)
	}
	r.out1(regIER, ierRDI|ierTHRI)
	if iir := r.in(regIIR); iir != iirRDI {
		t.Fatalf("IIR %#x, want RDI before THRI", iir)
	}
	got := []byte{r.in(regData), r.in(regData)}
	if string(got) != "hi" || r.in(regLSR)&lsrDR != 0 {
		t.Fatalf("read %q, LSR %#x", got, r.in(regLSR))
	}
	if iir := r.in(regIIR); iir != iirTHRI {
		t.Fatalf("IIR %#x after draining, want THRI", iir)
	}
	if n := r.u.Receive(make([]byte, 2*rxFIFOMax)); n != rxFIFOMax {
		t.Fatalf("Receive kept %d of an oversized burst, want %d", n, rxFIFOMax)
	}
	r.out1(regIIR, fcrEnable|fcrClearRx)
	if r.in(regLSR)&lsrDR != 0 {
		t.Fatal("FCR clear did not empty the receive FIFO")
	}
}
