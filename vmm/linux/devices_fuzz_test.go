package linux

import (
	"bytes"
	"testing"
	"time"

	"tine/internal/fuzzbytes"
)

// The port devices the fuzz target drives, in the low two bits of an
// operation's first byte; bit 2 makes it a write.
const (
	fuzzCMOS  = 0
	fuzzI8042 = 1
	fuzzPM    = 2
	fuzzEmpty = 3

	fuzzWrite = 1 << 2
	fuzzFar   = 1 << 6 // the port is any 16-bit port, not one near the device
)

// maxFuzzOps bounds the operations of one input.
const maxFuzzOps = 256

// fuzzSizes are the access sizes an operation picks from: the valid ones,
// an empty access and odd ones.
var fuzzSizes = [8]int{1, 2, 4, 1, 0, 3, 8, 2}

// cmosModel is the CMOS clock as its documentation describes it.
type cmosModel struct {
	index   byte
	ram     [128]byte
	statusB byte
	now     time.Time
}

func (m *cmosModel) read() byte {
	t := m.now.UTC()
	var v int
	switch m.index {
	case cmosSeconds:
		v = t.Second()
	case cmosMinutes:
		v = t.Minute()
	case cmosHours:
		v = t.Hour()
	case cmosWeekday:
		v = int(t.Weekday()) + 1
	case cmosDay:
		v = t.Day()
	case cmosMonth:
		v = int(t.Month())
	case cmosYear:
		v = t.Year() % 100
	case cmosCentury:
		v = t.Year() / 100
	case 1, 3, 5: // alarms: never set
	case cmosStatusA:
		return 0x26
	case cmosStatusB:
		return m.statusB
	case cmosStatusC:
		return 0
	case cmosStatusD:
		return cmosValid
	default:
		return m.ram[m.index]
	}
	if m.statusB&cmosBinary != 0 {
		return byte(v)
	}
	return byte(v/10<<4 | v%10)
}

func (m *cmosModel) write(b byte) {
	switch {
	case m.index == cmosStatusB:
		m.statusB = b | cmosHour24
	case m.index > cmosStatusD:
		m.ram[m.index] = b
	}
}

// pmModel is the PM1a register blocks: status write-one-to-clear, SCI_EN
// set, SLP_EN never stored.
type pmModel struct{ sts, en, cnt uint16 }

func (m *pmModel) regs() []byte {
	return le.AppendUint16(le.AppendUint16(le.AppendUint16(nil, m.sts), m.en), m.cnt|pm1CntSCIEN)
}

// FuzzPortDevices feeds the machine's own port devices (the CMOS clock at
// a time the input picks, the i8042, the ACPI PM1 blocks and the empty
// bus behind every other port) a sequence of at most maxFuzzOps reads and
// writes of any size (including empty and odd ones), at and around each
// device's ports or at any port. It asserts that nothing panics and that
// every byte read, each reset and each power-off is what a model of the
// device's documented behaviour gives: unknown ports read 0xff, the
// clock's time registers are BCD unless the guest asked for binary,
// status registers A, C and D are read-only and B keeps the 24-hour bit.
func FuzzPortDevices(f *testing.F) {
	clock := []byte{0xf0, 0xfd, 0x48, 0x6a} // 2026-07-04 12:34:56 UTC
	op := func(dev, sizeIdx byte, off byte, data ...byte) []byte {
		return append([]byte{dev | sizeIdx<<3, off + 2}, data...)
	}
	w := func(dev, off byte, data ...byte) []byte {
		return op(dev|fuzzWrite, map[int]byte{1: 0, 2: 1, 4: 2}[len(data)], off, data...)
	}
	r := func(dev, sizeIdx, off byte) []byte { return op(dev, sizeIdx, off) }
	join := func(ops ...[]byte) []byte { return bytes.Join(append([][]byte{clock, {0, 0}}, ops...), nil) }
	// Linux reading the clock at boot, then setting binary mode and
	// using CMOS RAM.
	f.Add(join(w(fuzzCMOS, 0, cmosStatusA), r(fuzzCMOS, 0, 1), w(fuzzCMOS, 0, cmosStatusB|0x80), r(fuzzCMOS, 0, 1),
		w(fuzzCMOS, 0, cmosSeconds), r(fuzzCMOS, 0, 1), w(fuzzCMOS, 0, cmosYear), r(fuzzCMOS, 0, 1),
		w(fuzzCMOS, 0, cmosCentury), r(fuzzCMOS, 0, 1), w(fuzzCMOS, 0, cmosStatusB), w(fuzzCMOS, 1, cmosBinary),
		w(fuzzCMOS, 0, cmosHours), r(fuzzCMOS, 0, 1), w(fuzzCMOS, 0, cmosStatusD, 0), r(fuzzCMOS, 2, 0),
		w(fuzzCMOS, 0, 0x40, 0x5a), r(fuzzCMOS, 0, 1)))
	// The i8042 probe and a reboot; ACPI mode, status clear and S5.
	f.Add(join(r(fuzzI8042, 0, 4), w(fuzzI8042, 4, 0xaa), r(fuzzI8042, 2, 0), w(fuzzI8042, 4, i8042Reset),
		r(fuzzPM, 1, 4), w(fuzzPM, 0, 0xff, 0xff), w(fuzzPM, 2, 0x01, 0x01), r(fuzzPM, 6, 0),
		w(fuzzPM, 4, 0, slpTypS5<<2), w(fuzzPM, 4, 0, slpTypS5<<2|pm1CntSlpEn>>8), r(fuzzEmpty, 2, 0)))
	// Far ports and odd sizes.
	f.Add(join([]byte{fuzzEmpty | fuzzFar | 2<<3, 0xfe, 0xff, fuzzCMOS | fuzzWrite | fuzzFar | 6<<3, 0x6f, 0x00, 1, 2, 3, 4, 5, 6, 7, 8},
		[]byte{fuzzPM | fuzzFar | 5<<3, 0xfe, 0x05, fuzzI8042 | fuzzWrite | 4<<3, 0}))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzbytes.New(data)
		var sec [4]byte
		copy(sec[:], in.Take(4))
		now := time.Unix(int64(le.Uint32(sec[:])), 0)
		c := newCMOS()
		c.now = func() time.Time { return now }
		cm := &cmosModel{now: now, statusB: cmosHour24}
		resets, wantResets := 0, 0
		kbd := &i8042{reset: func() { resets++ }}
		offs, wantOffs := 0, 0
		pm := &pmDevice{powerOff: func() { offs++ }}
		pm.sts = uint16(in.Byte()) | uint16(in.Byte())<<8
		pmm := &pmModel{sts: pm.sts}
		var buf [8]byte
		for n := 0; n < maxFuzzOps && in.Len() > 0; n++ {
			op := in.Byte()
			size := fuzzSizes[op>>3&7]
			var base, ports uint16
			var dev interface {
				In(uint16, []byte)
				Out(uint16, []byte)
			}
			switch op & 3 {
			case fuzzCMOS:
				dev, base, ports = c, cmosBase, 2
			case fuzzI8042:
				dev, base, ports = kbd, i8042Base, 5
			case fuzzPM:
				dev, base, ports = pm, pm1EvtBase, pmPorts
			default:
				dev, base, ports = emptyBus{}, 0xcf8, 8
			}
			port := base - 2 + uint16(in.Byte())%(ports+4)
			if op&fuzzFar != 0 {
				port = uint16(in.Byte())<<8 | port&0xff
			}
			p := buf[:size]
			if op&fuzzWrite == 0 {
				for i := range p {
					p[i] = 0xee
				}
				dev.In(port, p)
				for i, v := range p {
					at := int(port) + i
					want := byte(0xff)
					switch op & 3 {
					case fuzzCMOS:
						if at != cmosBase {
							want = cm.read()
						}
					case fuzzI8042:
						if at == i8042Command {
							want = i8042StatusOBF
						}
					case fuzzPM:
						if o := at - pm1EvtBase; o >= 0 && o < pmPorts {
							want = pmm.regs()[o]
						}
					}
					if v != want {
						t.Fatalf("device %d: read of %d bytes at %#x: byte %d is %#x, want %#x", op&3, size, port, i, v, want)
					}
				}
				continue
			}
			clear(p)
			copy(p, in.Take(size))
			dev.Out(port, p)
			switch op & 3 {
			case fuzzCMOS:
				for i, b := range p {
					if int(port)+i == cmosBase {
						cm.index = b & 0x7f
					} else {
						cm.write(b)
					}
				}
			case fuzzI8042:
				if port == i8042Command && size > 0 && p[0] == i8042Reset {
					wantResets++
				}
			case fuzzPM:
				regs := pmm.regs()
				var clearSts uint16
				for i, b := range p {
					switch o := int(port) + i - pm1EvtBase; {
					case o == 0 || o == 1:
						clearSts |= uint16(b) << (8 * o)
					case o >= 2 && o < pmPorts:
						regs[o] = b
					}
				}
				cnt := le.Uint16(regs[4:])
				pmm.sts &^= clearSts
				pmm.en, pmm.cnt = le.Uint16(regs[2:]), cnt&^pm1CntSlpEn
				if cnt&pm1CntSlpEn != 0 && cnt&pm1CntSlpTyp == slpTypS5<<10 {
					wantOffs++
				}
			}
			if resets != wantResets || offs != wantOffs {
				t.Fatalf("write of % x at %#x: %d resets and %d power-offs, want %d and %d", p, port, resets, offs, wantResets, wantOffs)
			}
		}
	})
}
