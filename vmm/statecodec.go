package vmm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"

	"tine/vmm/internal/kvmapi"
)

const stateMagic = "TINEVMS\x01"

// Limits a decoded state must respect.
const (
	maxStateVCPUs = 64
	maxXSAVE      = 1 << 20
	maxMSRs       = 4096
)

type stateHeader struct {
	MemSize  uint64
	NVCPU    uint32
	IRQChip  uint8
	HasClock uint8
	_        uint16
}

// MarshalBinary encodes the state in tine's versioned machine-state
// format (little-endian, KVM's struct layouts; see docs/vmm.md).
func (st *State) MarshalBinary() ([]byte, error) {
	var b bytes.Buffer
	w := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString(stateMagic)
	h := stateHeader{MemSize: st.MemSize, NVCPU: uint32(len(st.VCPUs))}
	if st.IRQChip {
		h.IRQChip = 1
	}
	if st.HasClock {
		h.HasClock = 1
	}
	w(h)
	if st.IRQChip {
		w(st.Chips)
		w(st.PIT)
	}
	if st.HasClock {
		w(st.Clock)
	}
	for i := range st.VCPUs {
		v := &st.VCPUs[i]
		w(v.Regs)
		w(v.Sregs)
		w(uint32(len(v.XSAVE)))
		b.Write(v.XSAVE)
		w(v.XCRS)
		w(uint32(len(v.MSRs)))
		for _, m := range v.MSRs {
			w(m.Index)
			w(m.Value)
		}
		if v.LAPIC != nil {
			w(uint8(1))
			w(v.LAPIC)
		} else {
			w(uint8(0))
		}
		w(v.Events)
		w(v.MPState)
		w(v.DebugRegs)
	}
	return b.Bytes(), nil
}

// UnmarshalState decodes a machine state written by MarshalBinary. name
// names the source in errors. It never panics on bad input.
func UnmarshalState(name string, data []byte) (*State, error) {
	r := bytes.NewReader(data)
	fail := func(what string, err error) (*State, error) {
		off := int64(len(data)) - int64(r.Len())
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("vmm: %s: offset %d: %s: %w: %v", name, off, what, errStateFormat, err)
	}
	rd := func(v any) error { return binary.Read(r, binary.LittleEndian, v) }
	magic := make([]byte, len(stateMagic))
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != stateMagic {
		return fail("magic", fmt.Errorf("not a tine machine state"))
	}
	var h stateHeader
	if err := rd(&h); err != nil {
		return fail("header", err)
	}
	if h.NVCPU == 0 || h.NVCPU > maxStateVCPUs {
		return fail("header", fmt.Errorf("%d vCPUs", h.NVCPU))
	}
	if h.MemSize == 0 || h.MemSize%PageSize != 0 {
		return fail("header", fmt.Errorf("memory size %d", h.MemSize))
	}
	if h.IRQChip > 1 || h.HasClock > 1 {
		return fail("header", fmt.Errorf("bad flags"))
	}
	st := &State{MemSize: h.MemSize, IRQChip: h.IRQChip == 1, HasClock: h.HasClock == 1}
	if st.IRQChip {
		if err := rd(&st.Chips); err != nil {
			return fail("irqchips", err)
		}
		if err := rd(&st.PIT); err != nil {
			return fail("PIT", err)
		}
	}
	if st.HasClock {
		if err := rd(&st.Clock); err != nil {
			return fail("clock", err)
		}
	}
	for i := range h.NVCPU {
		var v VCPUState
		what := func(s string) string { return fmt.Sprintf("vCPU %d %s", i, s) }
		if err := rd(&v.Regs); err != nil {
			return fail(what("regs"), err)
		}
		if err := rd(&v.Sregs); err != nil {
			return fail(what("sregs"), err)
		}
		var n uint32
		if err := rd(&n); err != nil {
			return fail(what("XSAVE size"), err)
		}
		if n > maxXSAVE || int64(n) > int64(r.Len()) {
			return fail(what("XSAVE size"), fmt.Errorf("%d bytes", n))
		}
		v.XSAVE = make([]byte, n)
		if _, err := io.ReadFull(r, v.XSAVE); err != nil {
			return fail(what("XSAVE"), err)
		}
		if err := rd(&v.XCRS); err != nil {
			return fail(what("XCRS"), err)
		}
		if v.XCRS.NrXRCS > uint32(len(v.XCRS.Registers)) {
			return fail(what("XCRS"), fmt.Errorf("%d registers", v.XCRS.NrXRCS))
		}
		if err := rd(&n); err != nil {
			return fail(what("MSR count"), err)
		}
		if n > maxMSRs || int64(n)*12 > int64(r.Len()) {
			return fail(what("MSR count"), fmt.Errorf("%d MSRs", n))
		}
		v.MSRs = make([]MSR, n)
		for j := range v.MSRs {
			if err := rd(&v.MSRs[j].Index); err != nil {
				return fail(what("MSRs"), err)
			}
			if err := rd(&v.MSRs[j].Value); err != nil {
				return fail(what("MSRs"), err)
			}
		}
		var has uint8
		if err := rd(&has); err != nil {
			return fail(what("LAPIC flag"), err)
		}
		switch has {
		case 0:
		case 1:
			v.LAPIC = new(kvmapi.LAPICState)
			if err := rd(v.LAPIC); err != nil {
				return fail(what("LAPIC"), err)
			}
		default:
			return fail(what("LAPIC flag"), fmt.Errorf("value %d", has))
		}
		if err := rd(&v.Events); err != nil {
			return fail(what("events"), err)
		}
		if err := rd(&v.MPState); err != nil {
			return fail(what("MP state"), err)
		}
		if err := rd(&v.DebugRegs); err != nil {
			return fail(what("debug registers"), err)
		}
		st.VCPUs = append(st.VCPUs, v)
	}
	if r.Len() != 0 {
		return fail("trailer", fmt.Errorf("%d bytes after the last vCPU", r.Len()))
	}
	return st, nil
}
