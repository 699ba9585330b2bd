package virtio

import (
	"encoding/binary"
	"testing"
)

// testDriver plays a guest driver against a transport over in-process
// guest memory: it sets up the queues through the registers and adds
// descriptor chains as Linux does.
type testDriver struct {
	t      testing.TB
	mem    Memory
	tr     *Transport
	irqs   int
	queues []drvQueue
	next   uint64 // bump allocator for buffers
}

type drvQueue struct {
	size               uint16
	desc, avail, used  uint64
	freeDesc           uint16
	availIdx, lastUsed uint16
}

const testBase = 0xd0000000

func newTestDriver(t testing.TB, dev Device, memSize int) *testDriver {
	d := &testDriver{t: t, mem: make(Memory, memSize), next: 0x100000}
	d.tr = NewTransport(testBase, d.mem, dev, func() { d.irqs++ })
	if d.read(RegMagic) != magicValue || d.read(RegVersion) != 2 || d.read(RegDeviceID) != dev.Type() {
		t.Fatal("transport identity registers wrong")
	}
	d.write(RegStatus, StatusAcknowledge|StatusDriver)
	d.write(RegDeviceFeatSel, 1)
	hi := d.read(RegDeviceFeatures)
	d.write(RegDeviceFeatSel, 0)
	lo := d.read(RegDeviceFeatures)
	d.write(RegDriverFeatSel, 1)
	d.write(RegDriverFeatures, hi)
	d.write(RegDriverFeatSel, 0)
	d.write(RegDriverFeatures, lo)
	d.write(RegStatus, StatusAcknowledge|StatusDriver|StatusFeaturesOK)
	if d.read(RegStatus)&StatusFeaturesOK == 0 {
		t.Fatal("features refused")
	}
	for i := range dev.QueueMax() {
		d.write(RegQueueSel, uint32(i))
		size := uint16(d.read(RegQueueNumMax))
		if size > 16 {
			size = 16
		}
		q := drvQueue{size: size}
		q.desc = d.alloc(16 * uint64(size))
		q.avail = d.alloc(6 + 2*uint64(size))
		q.used = d.alloc(6 + 8*uint64(size))
		d.write(RegQueueNum, uint32(size))
		d.write(RegQueueDescLow, uint32(q.desc))
		d.write(RegQueueDescHigh, uint32(q.desc>>32))
		d.write(RegQueueAvailLow, uint32(q.avail))
		d.write(RegQueueAvailHigh, 0)
		d.write(RegQueueUsedLow, uint32(q.used))
		d.write(RegQueueUsedHigh, 0)
		d.write(RegQueueReady, 1)
		d.queues = append(d.queues, q)
	}
	d.write(RegStatus, StatusAcknowledge|StatusDriver|StatusFeaturesOK|StatusDriverOK)
	return d
}

func (d *testDriver) alloc(n uint64) uint64 {
	a := (d.next + 15) &^ 15
	d.next = a + n
	if d.next > uint64(len(d.mem)) {
		d.t.Fatal("test driver out of guest memory")
	}
	return a
}

func (d *testDriver) read(off uint64) uint32 {
	var b [4]byte
	d.tr.Read(testBase+off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (d *testDriver) write(off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	d.tr.Write(testBase+off, b[:])
}

// buf is one descriptor the driver adds: readable data, or a writable
// buffer of a size.
type buf struct {
	data     []byte
	writable int
}

// add puts a chain into queue q's available ring and returns its head; it
// does not notify.
func (d *testDriver) add(q int, bufs ...buf) uint16 {
	dq := &d.queues[q]
	head := dq.freeDesc
	for i, b := range bufs {
		idx := (head + uint16(i)) % dq.size
		n := len(b.data)
		flags := uint16(0)
		if b.writable > 0 {
			n = b.writable
			flags |= DescWrite
		}
		a := d.alloc(uint64(n))
		copy(d.mem[a:], b.data)
		if i < len(bufs)-1 {
			flags |= DescNext
		}
		d.putDesc(q, idx, a, uint32(n), flags, (idx+1)%dq.size)
	}
	dq.freeDesc = (head + uint16(len(bufs))) % dq.size
	d.publish(q, head)
	return head
}

func (d *testDriver) putDesc(q int, idx uint16, addr uint64, n uint32, flags, next uint16) {
	dq := &d.queues[q]
	e := d.mem[dq.desc+16*uint64(idx):]
	binary.LittleEndian.PutUint64(e, addr)
	binary.LittleEndian.PutUint32(e[8:], n)
	binary.LittleEndian.PutUint16(e[12:], flags)
	binary.LittleEndian.PutUint16(e[14:], next)
}

func (d *testDriver) publish(q int, head uint16) {
	dq := &d.queues[q]
	binary.LittleEndian.PutUint16(d.mem[dq.avail+4+2*uint64(dq.availIdx%dq.size):], head)
	dq.availIdx++
	binary.LittleEndian.PutUint16(d.mem[dq.avail+2:], dq.availIdx)
}

func (d *testDriver) notify(q int) { d.write(RegQueueNotify, uint32(q)) }

// used returns the chains the device returned since the last call: head
// and length.
func (d *testDriver) used(q int) [][2]uint32 {
	dq := &d.queues[q]
	idx := binary.LittleEndian.Uint16(d.mem[dq.used+2:])
	var out [][2]uint32
	for dq.lastUsed != idx {
		e := d.mem[dq.used+4+8*uint64(dq.lastUsed%dq.size):]
		out = append(out, [2]uint32{binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:])})
		dq.lastUsed++
	}
	return out
}

// descBuf returns the guest memory of descriptor idx of queue q.
func (d *testDriver) descBuf(q int, idx uint16) []byte {
	dq := &d.queues[q]
	e := d.mem[dq.desc+16*uint64(idx%dq.size):]
	a, n := binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint32(e[8:])
	return d.mem[a : a+uint64(n)]
}

func (d *testDriver) failed() bool { return d.read(RegStatus)&StatusNeedsReset != 0 }
