package linux

import (
	"sync"
	"time"
)

// emptyBus answers for ports no device decodes: reads float high, writes
// vanish, as on an ISA bus with nothing plugged in.
type emptyBus struct{}

func (emptyBus) In(port uint16, data []byte) {
	for i := range data {
		data[i] = 0xff
	}
}

func (emptyBus) Out(port uint16, data []byte) {}

// The keyboard controller ports.
const (
	i8042Base    = 0x60
	i8042Command = 0x64
	i8042Reset   = 0xfe // command: pulse the CPU reset line
)

// i8042 is a keyboard controller with nothing behind it. Its status says
// the input buffer is empty (so a reboot's wait for it ends at once) and
// the output buffer full of 0xff (so Linux's probe, which drains it, gives
// up at once: "No controller found"). The one command it acts on is the
// reset pulse Linux uses to reboot.
type i8042 struct {
	reset func()
}

const i8042StatusOBF = 0x01

func (k *i8042) In(port uint16, data []byte) {
	for i := range data {
		data[i] = 0xff
		if port+uint16(i) == i8042Command {
			data[i] = i8042StatusOBF
		}
	}
}

func (k *i8042) Out(port uint16, data []byte) {
	if port == i8042Command && len(data) > 0 && data[0] == i8042Reset {
		k.reset()
	}
}

// The CMOS RTC ports and registers.
const (
	cmosBase    = 0x70
	cmosSeconds = 0x00
	cmosMinutes = 0x02
	cmosHours   = 0x04
	cmosWeekday = 0x06
	cmosDay     = 0x07
	cmosMonth   = 0x08
	cmosYear    = 0x09
	cmosStatusA = 0x0a
	cmosStatusB = 0x0b
	cmosStatusC = 0x0c
	cmosStatusD = 0x0d
	cmosCentury = 0x32

	cmosBinary = 0x04 // status B: values in binary, not BCD
	cmosHour24 = 0x02 // status B: 24-hour clock
	cmosValid  = 0x80 // status D: the clock's battery is good
)

// cmos is the MC146818 CMOS clock read-only: the time registers give the
// host's UTC time in BCD, as a PC's firmware leaves it (x86 Linux reads
// the clock as BCD whatever status B says: RTC_ALWAYS_BCD), or in binary
// once the guest sets status B's binary bit; the update-in-progress bit
// is never set, and the rest of the 128 bytes is plain RAM.
type cmos struct {
	mu    sync.Mutex
	index uint8
	ram   [128]uint8
	now   func() time.Time
}

func newCMOS() *cmos {
	c := &cmos{now: time.Now}
	c.ram[cmosStatusA] = 0x26 // 32.768 kHz time base, 1024 Hz rate
	c.ram[cmosStatusB] = cmosHour24
	c.ram[cmosStatusD] = cmosValid
	return c
}

func (c *cmos) In(port uint16, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range data {
		if port+uint16(i) == cmosBase {
			data[i] = 0xff
			continue
		}
		data[i] = c.read(c.index)
	}
}

func (c *cmos) Out(port uint16, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, b := range data {
		if port+uint16(i) == cmosBase {
			c.index = b & 0x7f // bit 7 masks NMIs
			continue
		}
		switch c.index {
		case cmosStatusA, cmosStatusC, cmosStatusD:
			// read-only here
		case cmosStatusB:
			c.ram[cmosStatusB] = b | cmosHour24
		default:
			if c.index > cmosStatusD {
				c.ram[c.index] = b
			}
		}
	}
}

func (c *cmos) read(reg uint8) uint8 {
	if reg <= cmosYear || reg == cmosCentury {
		v := c.timeReg(reg)
		if c.ram[cmosStatusB]&cmosBinary == 0 {
			v = v/10<<4 | v%10
		}
		return v
	}
	return c.ram[reg]
}

// timeReg is a time register's value in binary.
func (c *cmos) timeReg(reg uint8) uint8 {
	t := c.now().UTC()
	switch reg {
	case cmosSeconds:
		return uint8(t.Second())
	case cmosMinutes:
		return uint8(t.Minute())
	case cmosHours:
		return uint8(t.Hour())
	case cmosWeekday:
		return uint8(t.Weekday()) + 1
	case cmosDay:
		return uint8(t.Day())
	case cmosMonth:
		return uint8(t.Month())
	case cmosYear:
		return uint8(t.Year() % 100)
	case cmosCentury:
		return uint8(t.Year() / 100)
	}
	return c.ram[reg]
}
