package linux

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"tine/vmm"
	"tine/vmm/virtio"
)

// Where virtio-mmio devices live (ADR 0170): register windows from
// VirtioBase, one page apart, above RAM (at most MaxMem) and below the
// IOAPIC; interrupts on IOAPIC pins from VirtioGSIBase, edge-triggered.
const (
	VirtioBase    = 0xd0000000
	VirtioStride  = 0x1000
	VirtioGSIBase = 16
	// MaxVirtio is how many devices a machine has room for (IOAPIC pins
	// 16 to 23).
	MaxVirtio = 8
)

// VirtioSlot is one device's register window and GSI, as the DSDT
// describes it.
type VirtioSlot struct {
	Base uint64
	GSI  uint32
}

// virtioAML returns Scope (\_SB) { Device (VIRn) {...} ... } for the
// slots: each with _HID "LNRO0005" (what Linux's virtio_mmio matches), a
// _UID, and a _CRS with a Memory32Fixed window and an extended Interrupt
// descriptor (consumer, edge, active high, exclusive).
func virtioAML(slots []VirtioSlot) []byte {
	if len(slots) == 0 {
		return nil
	}
	var body []byte
	body = append(body, '_', 'S', 'B', '_')
	for i, s := range slots {
		var crs []byte
		crs = append(crs, 0x86, 0x09, 0x00, 0x01) // Memory32Fixed, read-write
		crs = binary.LittleEndian.AppendUint32(crs, uint32(s.Base))
		crs = binary.LittleEndian.AppendUint32(crs, virtio.WindowSize)
		crs = append(crs, 0x89, 0x06, 0x00, 0x03, 0x01) // extended IRQ: consumer|edge, one
		crs = binary.LittleEndian.AppendUint32(crs, s.GSI)
		crs = append(crs, 0x79, 0x00) // end tag
		buf := append([]byte{0x0a, byte(len(crs))}, crs...)
		var dev []byte
		dev = append(dev, fmt.Sprintf("VIR%X", i)...)
		dev = append(dev, 0x08, '_', 'H', 'I', 'D', 0x0d)
		dev = append(dev, "LNRO0005"...)
		dev = append(dev, 0x00)
		dev = append(dev, 0x08, '_', 'U', 'I', 'D', 0x0a, byte(i))
		dev = append(dev, 0x08, '_', 'C', 'R', 'S', 0x11)
		dev = append(dev, pkgLength(len(buf))...)
		dev = append(dev, buf...)
		body = append(body, 0x5b, 0x82) // DeviceOp
		body = append(body, pkgLength(len(dev))...)
		body = append(body, dev...)
	}
	return append(append([]byte{0x10}, pkgLength(len(body))...), body...) // ScopeOp
}

// pkgLength encodes an AML PkgLength for n bytes of content (the
// encoding counts its own bytes).
func pkgLength(n int) []byte {
	if n+1 < 0x40 {
		return []byte{byte(n + 1)}
	}
	if n+2 < 0x1000 {
		l := n + 2
		return []byte{0x40 | byte(l&0xf), byte(l >> 4)}
	}
	l := n + 3
	return []byte{0x80 | byte(l&0xf), byte(l >> 4), byte(l >> 12)}
}

// virtioDevices puts each device behind a transport on the machine:
// interrupts through irqfd where KVM offers it (else a KVM_IRQ_LINE
// pulse), queue notifications through an ioeventfd per queue where
// offered (else the MMIO exit).
func (m *Machine) addVirtio(devs []virtio.Device) ([]VirtioSlot, error) {
	if len(devs) > MaxVirtio {
		return nil, fmt.Errorf("%d virtio devices, at most %d", len(devs), MaxVirtio)
	}
	vm := m.VM
	irqfd, ioeventfd := vm.HasIRQFD(), vm.HasIOEventFD()
	var slots []VirtioSlot
	for i, d := range devs {
		s := VirtioSlot{Base: VirtioBase + uint64(i)*VirtioStride, GSI: VirtioGSIBase + uint32(i)}
		irq := func() {
			vm.SetIRQ(s.GSI, true)
			vm.SetIRQ(s.GSI, false)
		}
		if irqfd {
			fd, err := vm.IRQFD(s.GSI)
			if err != nil {
				return nil, err
			}
			m.fds = append(m.fds, fd)
			one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
			irq = func() { unix.Write(fd, one) }
		}
		t := virtio.NewTransport(s.Base, virtio.Memory(vm.Mem()), d, irq)
		if err := vm.AddMMIODevice(s.Base, VirtioStride, t); err != nil {
			return nil, err
		}
		if ioeventfd {
			for q := range d.QueueMax() {
				fd, err := vm.IOEventFD(s.Base+virtio.RegQueueNotify, uint32(q))
				if err != nil {
					return nil, err
				}
				f := os.NewFile(uintptr(fd), "ioeventfd")
				m.files = append(m.files, f)
				go notifyLoop(f, t, q)
			}
		}
		m.Virtio = append(m.Virtio, t)
		slots = append(slots, s)
	}
	return slots, nil
}

// notifyLoop turns an ioeventfd's signals into queue kicks until the
// file is closed (the runtime's poller wakes the read then).
func notifyLoop(f *os.File, t *virtio.Transport, q int) {
	var b [8]byte
	for {
		n, err := f.Read(b[:])
		if err != nil || n != 8 {
			return
		}
		t.Kick(q)
	}
}

var _ vmm.MMIODevice = (*virtio.Transport)(nil)
