// Package serial emulates the part of a 16550A UART that Linux's 8250
// driver and its earlycon use: transmit and receive holding registers, the
// interrupt enable and identification registers, line and modem control,
// line and modem status, the scratch register and the divisor latch.
//
// Transmission is instantaneous: every byte the guest writes goes straight
// to an io.Writer, so the line status always reports an empty transmitter
// (THRE and TEMT). Received bytes are queued by Receive. The interrupt line
// follows the 16550's rules (level = an enabled condition is pending) and is
// driven through a callback, normally vmm.VM.SetIRQ on the UART's IRQ.
package serial

import (
	"io"
	"sync"
)

// The first PC serial port.
const (
	COM1Base = 0x3f8
	COM1IRQ  = 4
)

// Ports is the number of I/O ports a UART decodes.
const Ports = 8

// Register offsets from the base port.
const (
	regData = 0 // RBR (read), THR (write), DLL (DLAB=1)
	regIER  = 1 // interrupt enable, DLM (DLAB=1)
	regIIR  = 2 // interrupt identification (read), FCR (write)
	regLCR  = 3
	regMCR  = 4
	regLSR  = 5
	regMSR  = 6
	regSCR  = 7
)

// Register bits.
const (
	ierRDI  = 0x01 // received data available
	ierTHRI = 0x02 // transmitter holding register empty
	ierRLSI = 0x04 // receiver line status
	ierMSI  = 0x08 // modem status

	iirNone   = 0x01
	iirMSI    = 0x00
	iirTHRI   = 0x02
	iirRDI    = 0x04
	iirFIFOOn = 0xc0

	fcrEnable  = 0x01
	fcrClearRx = 0x02

	lcrDLAB = 0x80

	mcrDTR  = 0x01
	mcrRTS  = 0x02
	mcrOUT1 = 0x04
	mcrOUT2 = 0x08
	mcrLoop = 0x10

	lsrDR   = 0x01
	lsrTHRE = 0x20
	lsrTEMT = 0x40

	msrCTS = 0x10
	msrDSR = 0x20
	msrRI  = 0x40
	msrDCD = 0x80

	rxFIFOMax = 4096
)

// Config configures a UART.
type Config struct {
	// Base is the first I/O port (COM1Base for ttyS0).
	Base uint16
	// Out receives every byte the guest transmits; nil discards them.
	Out io.Writer
	// IRQ sets the level of the UART's interrupt line; nil for none. It
	// is called only when the level changes, with the UART's lock held,
	// so it must not call back into the UART.
	IRQ func(high bool)
}

// UART is one emulated 16550A. Its methods are safe for concurrent use:
// the vCPU thread does port I/O while another goroutine calls Receive.
type UART struct {
	cfg Config

	mu      sync.Mutex
	ier     uint8
	lcr     uint8
	mcr     uint8
	scr     uint8
	dll     uint8
	dlm     uint8
	fcr     uint8
	msr     uint8 // modem status when not in loopback
	thri    bool  // a THR-empty interrupt is pending
	rx      []byte
	irqHigh bool
}

// New returns a UART in its reset state, with the divisor set for 115200
// baud and the modem lines reporting a connected peer.
func New(cfg Config) *UART {
	return &UART{cfg: cfg, dll: 1, msr: msrDCD | msrDSR | msrCTS}
}

// In handles a guest read from port; it implements vmm.PortDevice.
func (u *UART) In(port uint16, data []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := range data {
		data[i] = u.read(port - u.cfg.Base + uint16(i))
	}
	u.updateIRQ()
}

// Out handles a guest write to port; it implements vmm.PortDevice.
func (u *UART) Out(port uint16, data []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, b := range data {
		u.write(port-u.cfg.Base+uint16(i), b)
	}
	u.updateIRQ()
}

// Receive queues bytes as if they arrived on the line. Bytes beyond a 4 KiB
// backlog are dropped (an overrun) and Receive returns how many it kept.
func (u *UART) Receive(b []byte) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := min(len(b), rxFIFOMax-len(u.rx))
	u.rx = append(u.rx, b[:n]...)
	u.updateIRQ()
	return n
}

func (u *UART) read(off uint16) uint8 {
	switch off {
	case regData:
		if u.lcr&lcrDLAB != 0 {
			return u.dll
		}
		if len(u.rx) == 0 {
			return 0
		}
		b := u.rx[0]
		u.rx = u.rx[1:]
		if len(u.rx) == 0 {
			u.rx = nil
		}
		return b
	case regIER:
		if u.lcr&lcrDLAB != 0 {
			return u.dlm
		}
		return u.ier
	case regIIR:
		iir := u.pending()
		if iir == iirTHRI {
			// Reading IIR acknowledges a THR-empty interrupt.
			u.thri = false
		}
		if u.fcr&fcrEnable != 0 {
			iir |= iirFIFOOn
		}
		return iir
	case regLCR:
		return u.lcr
	case regMCR:
		return u.mcr
	case regLSR:
		lsr := uint8(lsrTHRE | lsrTEMT)
		if len(u.rx) > 0 {
			lsr |= lsrDR
		}
		return lsr
	case regMSR:
		return u.modemStatus()
	case regSCR:
		return u.scr
	}
	return 0xff
}

func (u *UART) write(off uint16, b uint8) {
	switch off {
	case regData:
		if u.lcr&lcrDLAB != 0 {
			u.dll = b
			return
		}
		if u.mcr&mcrLoop != 0 {
			if len(u.rx) < rxFIFOMax {
				u.rx = append(u.rx, b)
			}
		} else if u.cfg.Out != nil {
			u.cfg.Out.Write([]byte{b})
		}
		// The byte left at once: the holding register is empty again.
		u.thri = u.ier&ierTHRI != 0
	case regIER:
		if u.lcr&lcrDLAB != 0 {
			u.dlm = b
			return
		}
		old := u.ier
		u.ier = b & 0x0f
		if u.ier&ierTHRI != 0 && old&ierTHRI == 0 {
			u.thri = true
		} else if u.ier&ierTHRI == 0 {
			u.thri = false
		}
	case regIIR:
		u.fcr = b
		if b&fcrClearRx != 0 {
			u.rx = nil
		}
	case regLCR:
		u.lcr = b
	case regMCR:
		u.mcr = b & 0x1f
	case regSCR:
		u.scr = b
	}
}

// modemStatus returns MSR: in loopback the control lines are wired back to
// the status lines; otherwise a peer is always there.
func (u *UART) modemStatus() uint8 {
	if u.mcr&mcrLoop == 0 {
		return u.msr
	}
	var m uint8
	if u.mcr&mcrDTR != 0 {
		m |= msrDSR
	}
	if u.mcr&mcrRTS != 0 {
		m |= msrCTS
	}
	if u.mcr&mcrOUT1 != 0 {
		m |= msrRI
	}
	if u.mcr&mcrOUT2 != 0 {
		m |= msrDCD
	}
	return m
}

// pending returns the IIR value of the highest-priority enabled interrupt.
func (u *UART) pending() uint8 {
	switch {
	case u.ier&ierRDI != 0 && len(u.rx) > 0:
		return iirRDI
	case u.ier&ierTHRI != 0 && u.thri:
		return iirTHRI
	}
	return iirNone
}

func (u *UART) updateIRQ() {
	high := u.pending() != iirNone
	if high == u.irqHigh {
		return
	}
	u.irqHigh = high
	if u.cfg.IRQ != nil {
		u.cfg.IRQ(high)
	}
}
