package linux

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"tine/vmm"
	"tine/vmm/serial"
	"tine/vmm/virtio"
)

// A MachineImage on disk is a vmm image directory (docs/vmm.md) whose
// device state holds what the machine adds to the VM:
//
//	"TINELNX2" | boot: u8 n, n bytes of protocol, bootWire
//	| UART: uartWire, u16 n, n bytes of pending input (at most serial.MaxRX)
//	| u8 devices (at most MaxVirtio), each: u32 type, transportWire,
//	  u8 queues (at most maxQueues), each queueWire,
//	  u32 n, n bytes of the device's own state (virtio.StatefulDevice,
//	  at most virtio.MaxDeviceState)
//
// Little-endian, fixed-size records; every count is bounded. An image
// written before devices had state of their own ("TINELNX1": no state
// field) still opens.
const (
	devMagic   = "TINELNX2"
	devMagicV1 = "TINELNX1"
	maxQueues  = 16
)

var errDevState = errors.New("bad machine device state")

type bootWire struct {
	Regs                   Regs
	Sregs                  Sregs
	KernelStart, KernelEnd uint64
	InitrdAddr, InitrdSize uint64
	CmdlineAddr, Entry     uint64
}

type uartWire struct {
	IER, LCR, MCR, SCR, DLL, DLM, FCR, MSR uint8
	THRI, IRQHigh                          bool
}

type transportWire struct {
	Status, IntStatus      uint32
	DevFeatSel, DrvFeatSel uint32
	DriverFeatures         uint64
	QueueSel, ConfigGen    uint32
}

type queueWire struct {
	Size, Max         uint16
	Desc, Avail, Used uint64
	Ready             bool
	LastAvail         uint16
	UsedIdx           uint16
}

// encodeDevices serializes the image's machine-level state.
func (mi *MachineImage) encodeDevices() ([]byte, error) {
	var b bytes.Buffer
	w := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString(devMagic)
	bt := mi.boot
	if bt == nil {
		bt = &Boot{}
	}
	if len(bt.Protocol) > 255 || len(mi.uart.RX) > serial.MaxRX || len(mi.types) > MaxVirtio {
		return nil, errors.New("linux machine image: device state out of bounds")
	}
	w(uint8(len(bt.Protocol)))
	b.WriteString(string(bt.Protocol))
	w(bootWire{Regs: bt.Regs, Sregs: bt.Sregs, KernelStart: bt.KernelStart, KernelEnd: bt.KernelEnd,
		InitrdAddr: bt.InitrdAddr, InitrdSize: bt.InitrdSize, CmdlineAddr: bt.CmdlineAddr, Entry: bt.Entry})
	u := mi.uart
	w(uartWire{u.IER, u.LCR, u.MCR, u.SCR, u.DLL, u.DLM, u.FCR, u.MSR, u.THRI, u.IRQHigh})
	w(uint16(len(u.RX)))
	b.Write(u.RX)
	w(uint8(len(mi.types)))
	for i, typ := range mi.types {
		s := mi.states[i]
		if len(s.Queues) > maxQueues {
			return nil, fmt.Errorf("linux machine image: device %d has %d queues, at most %d", i, len(s.Queues), maxQueues)
		}
		w(typ)
		w(transportWire{s.Status, s.IntStatus, s.DevFeatSel, s.DrvFeatSel, s.DriverFeatures, s.QueueSel, s.ConfigGen})
		w(uint8(len(s.Queues)))
		for _, q := range s.Queues {
			w(queueWire{q.Size, q.Max, q.Desc, q.Avail, q.Used, q.Ready, q.LastAvail, q.UsedIdx})
		}
		ds := mi.devState(i)
		if len(ds) > virtio.MaxDeviceState {
			return nil, fmt.Errorf("linux machine image: device %d has %d bytes of state, at most %d", i, len(ds), virtio.MaxDeviceState)
		}
		w(uint32(len(ds)))
		b.Write(ds)
	}
	return b.Bytes(), nil
}

// decodeDevices parses what encodeDevices wrote into mi; name names the
// source in errors, with the offset of what is wrong. It never panics.
func (mi *MachineImage) decodeDevices(name string, data []byte) error {
	r := bytes.NewReader(data)
	fail := func(what string, err error) error {
		off := len(data) - r.Len()
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("linux machine image: %s: device state offset %d: %s: %w: %v", name, off, what, errDevState, err)
	}
	rd := func(v any) error { return binary.Read(r, binary.LittleEndian, v) }
	magic := make([]byte, len(devMagic))
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != devMagic && string(magic) != devMagicV1 {
		return fail("magic", errors.New("not a Linux machine's device state"))
	}
	v1 := string(magic) == devMagicV1
	var n8 uint8
	if err := rd(&n8); err != nil {
		return fail("boot protocol", err)
	}
	proto := make([]byte, n8)
	if _, err := io.ReadFull(r, proto); err != nil {
		return fail("boot protocol", err)
	}
	var bw bootWire
	if err := rd(&bw); err != nil {
		return fail("boot", err)
	}
	mi.boot = &Boot{Protocol: Protocol(proto), Regs: bw.Regs, Sregs: bw.Sregs, KernelStart: bw.KernelStart, KernelEnd: bw.KernelEnd,
		InitrdAddr: bw.InitrdAddr, InitrdSize: bw.InitrdSize, CmdlineAddr: bw.CmdlineAddr, Entry: bw.Entry}
	var uw uartWire
	if err := rd(&uw); err != nil {
		return fail("UART", err)
	}
	var n16 uint16
	if err := rd(&n16); err != nil {
		return fail("UART input size", err)
	}
	if int(n16) > serial.MaxRX {
		return fail("UART input size", fmt.Errorf("%d bytes, at most %d", n16, serial.MaxRX))
	}
	rx := make([]byte, n16)
	if _, err := io.ReadFull(r, rx); err != nil {
		return fail("UART input", err)
	}
	mi.uart = serial.State{IER: uw.IER, LCR: uw.LCR, MCR: uw.MCR, SCR: uw.SCR, DLL: uw.DLL, DLM: uw.DLM, FCR: uw.FCR, MSR: uw.MSR,
		THRI: uw.THRI, IRQHigh: uw.IRQHigh, RX: rx}
	if err := rd(&n8); err != nil {
		return fail("device count", err)
	}
	if n8 > MaxVirtio {
		return fail("device count", fmt.Errorf("%d devices, at most %d", n8, MaxVirtio))
	}
	mi.types, mi.states, mi.dev = nil, nil, nil
	for i := range int(n8) {
		what := func(s string) string { return fmt.Sprintf("device %d %s", i, s) }
		var typ uint32
		if err := rd(&typ); err != nil {
			return fail(what("type"), err)
		}
		var tw transportWire
		if err := rd(&tw); err != nil {
			return fail(what("transport"), err)
		}
		var nq uint8
		if err := rd(&nq); err != nil {
			return fail(what("queue count"), err)
		}
		if nq > maxQueues {
			return fail(what("queue count"), fmt.Errorf("%d queues, at most %d", nq, maxQueues))
		}
		s := virtio.State{Status: tw.Status, IntStatus: tw.IntStatus, DevFeatSel: tw.DevFeatSel, DrvFeatSel: tw.DrvFeatSel,
			DriverFeatures: tw.DriverFeatures, QueueSel: tw.QueueSel, ConfigGen: tw.ConfigGen, Queues: []virtio.Queue{}}
		for j := range int(nq) {
			var qw queueWire
			if err := rd(&qw); err != nil {
				return fail(what(fmt.Sprintf("queue %d", j)), err)
			}
			s.Queues = append(s.Queues, virtio.Queue{Size: qw.Size, Max: qw.Max, Desc: qw.Desc, Avail: qw.Avail, Used: qw.Used,
				Ready: qw.Ready, LastAvail: qw.LastAvail, UsedIdx: qw.UsedIdx})
		}
		var ds []byte
		if !v1 {
			var n32 uint32
			if err := rd(&n32); err != nil {
				return fail(what("state size"), err)
			}
			if uint64(n32) > uint64(min(r.Len(), virtio.MaxDeviceState)) {
				return fail(what("state size"), fmt.Errorf("%d bytes, %d left (at most %d)", n32, r.Len(), virtio.MaxDeviceState))
			}
			if n32 > 0 {
				ds = make([]byte, n32)
				io.ReadFull(r, ds)
			}
		}
		mi.types = append(mi.types, typ)
		mi.states = append(mi.states, s)
		mi.dev = append(mi.dev, ds)
	}
	if r.Len() != 0 {
		return fail("trailer", fmt.Errorf("%d bytes after the last device", r.Len()))
	}
	return nil
}

// SaveDir writes the image to a new image directory dir (see
// vmm.(*Image).SaveDir): after a crash dir is absent or whole. Any
// process can clone the machine from it with OpenMachineImage.
func (mi *MachineImage) SaveDir(dir string) error {
	dev, err := mi.encodeDevices()
	if err != nil {
		return err
	}
	if err := mi.img.SaveDir(dir, dev); err != nil {
		return fmt.Errorf("linux machine image: %w", err)
	}
	return nil
}

// OpenMachineImage opens an image directory written by SaveDir. Its
// memory file must never be written while the image or a clone of it is
// in use.
func OpenMachineImage(dir string) (*MachineImage, error) {
	img, dev, err := vmm.OpenImageDir(dir, vmm.Config{})
	if err != nil {
		return nil, fmt.Errorf("linux machine image: %w", err)
	}
	if !img.State().IRQChip {
		img.Close()
		return nil, fmt.Errorf("linux machine image: %s: not a Linux machine (no irqchip)", dir)
	}
	mi := &MachineImage{img: img}
	if err := mi.decodeDevices(dir, dev); err != nil {
		img.Close()
		return nil, err
	}
	return mi, nil
}

// Size returns the image's guest RAM in bytes and its vCPUs.
func (mi *MachineImage) Size() (mem uint64, vcpus int) {
	return mi.img.Size(), len(mi.img.State().VCPUs)
}
