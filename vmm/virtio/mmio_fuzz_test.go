package virtio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"tine/internal/fuzzbytes"
)

// The register fuzz target runs a device over fuzzMemSize bytes of guest
// RAM with fuzzGuard bytes of canary on either side, for at most
// maxFuzzOps operations.
const (
	fuzzMemSize = 4 << 12
	fuzzGuard   = 1 << 12
	maxFuzzOps  = 256
	fuzzCanary  = 0xa5
)

// Operation kinds, in the low two bits of an operation's first byte.
const (
	fuzzOpRead  = 0
	fuzzOpWrite = 1
	fuzzOpPoke  = 2 // the guest stores bytes into its RAM
	fuzzOpKick  = 3 // an ioeventfd notification; with fuzzHost, host input
	fuzzHost    = 1 << 7
)

// fuzzSizes are the access sizes an operation picks from: the valid ones,
// an empty access and odd ones.
var fuzzSizes = [8]int{1, 2, 4, 8, 0, 3, 16, 4}

// fuzzDeviceKinds is the number of device types the target builds.
const fuzzDeviceKinds = 6

// fuzzEntropy is a fixed entropy source: the rng device stays cheap and
// deterministic.
type fuzzEntropy struct{}

func (fuzzEntropy) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 0x5a
	}
	return len(p), nil
}

// discardBackend is a network backend that takes every frame and never
// receives one.
type discardBackend struct{}

func (discardBackend) Read([]byte) (int, error)    { return 0, io.EOF }
func (discardBackend) Write(p []byte) (int, error) { return len(p), nil }
func (discardBackend) Close() error                { return nil }

// nullFSConn is a FUSE server that takes every request and never answers.
type nullFSConn struct {
	once sync.Once
	done chan struct{}
}

func (c *nullFSConn) Read([]byte) (int, error) {
	<-c.done
	return 0, io.EOF
}
func (c *nullFSConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *nullFSConn) Close() error                { c.once.Do(func() { close(c.done) }); return nil }
func (c *nullFSConn) Export() ([]byte, error)     { return nil, errors.New("no tables") }

// fuzzDevice builds device kind k (modulo fuzzDeviceKinds) and returns it
// with the bytes of its configuration space and the function that stops
// it.
func fuzzDevice(k byte) (Device, []byte, func(*Transport)) {
	none := func(*Transport) {}
	switch k % fuzzDeviceKinds {
	case 0:
		disk := make(memDisk, 32*sectorSize)
		return &Block{Disk: disk, ID: "fuzz-disk", ReadOnly: k&0x80 != 0}, le.AppendUint64(nil, 32), none
	case 1:
		return &Net{MAC: testMAC, Backend: discardBackend{}}, append([]byte(nil), testMAC...), none
	case 2:
		v := &Vsock{GuestCID: 3}
		v.Expose(1, func() (net.Conn, error) { return nil, errors.New("refused") })
		return v, le.AppendUint64(nil, 3), func(*Transport) { v.Close() }
	case 3:
		fs := &FS{Tag: "fuzz", Connect: func([]byte) (FSConn, error) {
			return &nullFSConn{done: make(chan struct{})}, nil
		}}
		cfg := make([]byte, FSTagSize, FSTagSize+4)
		copy(cfg, fs.Tag)
		return fs, le.AppendUint32(cfg, 1), fs.Close
	case 4:
		return &Console{}, nil, none
	default:
		return &RNG{Source: fuzzEntropy{}}, nil, none
	}
}

// fuzzAddr turns an operation's address mode and 16-bit offset into a
// guest-physical address: inside the window, past it, far past it, or
// below the window's base.
func fuzzAddr(mode byte, off uint16) uint64 {
	switch mode & 3 {
	case 0:
		return testBase + uint64(off)%WindowSize
	case 1:
		return testBase + uint64(off)
	case 2:
		return testBase + uint64(off)<<32
	default:
		return testBase - 1 - uint64(off)
	}
}

// runTransportOps builds the device the first byte of data names behind a
// transport and applies the operations that follow, checking each. It
// returns guest RAM and the device's error as the operations left them.
func runTransportOps(t testing.TB, data []byte) (Memory, error) {
	r := fuzzbytes.New(data)
	dev, cfg, stop := fuzzDevice(r.Byte())
	backing := bytes.Repeat([]byte{fuzzCanary}, fuzzGuard+fuzzMemSize+fuzzGuard)
	mem := Memory(backing[fuzzGuard : fuzzGuard+fuzzMemSize : fuzzGuard+fuzzMemSize])
	clear(mem)
	tr := NewTransport(testBase, mem, dev, nil)
	defer stop(tr)
	maxes := dev.QueueMax()
	var buf [16]byte
	for n := 0; n < maxFuzzOps && r.Len() > 0; n++ {
		op := r.Byte()
		size := fuzzSizes[op>>2&7]
		switch op & 3 {
		case fuzzOpRead:
			addr := fuzzAddr(op>>5, r.U16())
			p := buf[:size]
			for i := range p {
				p[i] = 0xee
			}
			tr.Read(addr, p)
			checkRead(t, dev, cfg, addr-testBase, p)
		case fuzzOpWrite:
			addr := fuzzAddr(op>>5, r.U16())
			p := buf[:size]
			clear(p)
			copy(p, r.Take(size))
			tr.Write(addr, p)
		case fuzzOpPoke:
			a := int(r.U16()) % len(mem)
			// Under the lock: the device's goroutines use the rings too.
			tr.mu.Lock()
			copy(mem[a:], r.Take(int(r.Byte())))
			tr.mu.Unlock()
		case fuzzOpKick:
			if op&fuzzHost != 0 {
				hostInput(tr, r.Byte())
			} else {
				tr.Kick(int(int8(r.Byte())))
			}
		}
		checkTransport(t, tr, maxes)
	}
	failed := tr.Err()
	// A reset always brings the device back.
	tr.Write(testBase+RegStatus, []byte{0, 0, 0, 0})
	var st [4]byte
	tr.Read(testBase+RegStatus, st[:])
	if le.Uint32(st[:]) != 0 || tr.Err() != nil {
		t.Fatalf("after a reset: status %#x, error %v", le.Uint32(st[:]), tr.Err())
	}
	tr.mu.Lock()
	for i, q := range tr.queues {
		if q.Ready || q.Size != 0 || q.Desc|q.Avail|q.Used != 0 {
			t.Fatalf("queue %d survived a reset: %+v", i, q)
		}
	}
	tr.mu.Unlock()
	for i, b := range backing {
		if (i < fuzzGuard || i >= fuzzGuard+fuzzMemSize) && b != fuzzCanary {
			t.Fatalf("byte %d outside guest RAM changed", i-fuzzGuard)
		}
	}
	return mem, failed
}

// hostInput delivers host-side input of a size n picks to the device, as
// its own goroutines would: a received frame, console input, or the
// transport reset a restored or forked machine's vsock gets.
func hostInput(tr *Transport, n byte) {
	switch d := tr.Device().(type) {
	case *Net:
		f := frame(minNetFrame+8*int(n), n)
		tr.Do(func() error {
			if d.pending != nil {
				return nil // the reader waits for room
			}
			d.pending = f
			return d.deliver(tr)
		})
	case *Console:
		d.Send(tr, bytes.Repeat([]byte{n}, int(n)))
	case *Vsock:
		d.ResetTransport(tr)
	}
}

// checkRead checks a register or configuration read at window offset off
// (wrapped when the address was below the window).
func checkRead(t testing.TB, dev Device, cfg []byte, off uint64, p []byte) {
	if off >= RegConfig {
		c := off - RegConfig
		for i, b := range p {
			want := byte(0)
			if c < uint64(len(cfg)) && uint64(i) < uint64(len(cfg))-c {
				want = cfg[c+uint64(i)]
			}
			if b != want {
				t.Fatalf("config read of %d bytes at %#x: byte %d is %#x, want %#x", len(p), c, i, b, want)
			}
		}
		return
	}
	if len(p) != 4 || off%4 != 0 {
		if !bytes.Equal(p, make([]byte, len(p))) {
			t.Fatalf("read of %d bytes at %#x gave % x", len(p), off, p)
		}
		return
	}
	v := le.Uint32(p)
	bad := false
	switch off {
	case RegMagic:
		bad = v != magicValue
	case RegVersion:
		bad = v != 2
	case RegDeviceID:
		bad = v != dev.Type()
	case RegVendorID:
		bad = v != vendorID
	case RegShmLenLow, RegShmLenHigh, RegShmBaseLow, RegShmBaseHigh:
		bad = v != 0xffffffff
	case RegQueueNumMax:
		bad = v > MaxQueueSize
	case RegQueueReady:
		bad = v > 1
	case RegInterruptStat:
		bad = v&^(IntUsedBuffer|IntConfigChange) != 0
	case RegStatus:
		bad = v > 0xff
	case RegDeviceFeatures, RegConfigGen:
	default:
		bad = v != 0 // write-only or unknown
	}
	if bad {
		t.Fatalf("register %#x reads %#x", off, v)
	}
}

// checkTransport checks the transport's invariants: a live queue's rings
// lie in guest RAM, the queues keep their bounds, and a device stopped by
// the guest names the guest's fault.
func checkTransport(t testing.TB, tr *Transport, maxes []uint16) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i := range tr.queues {
		q := &tr.queues[i]
		if q.Max != maxes[i] {
			t.Fatalf("queue %d: QueueNumMax changed to %d", i, q.Max)
		}
		if q.Ready {
			if err := q.check(tr.mem); err != nil {
				t.Fatalf("queue %d is live with bad geometry: %v", i, err)
			}
		}
	}
	if err := tr.err; err != nil && !errors.Is(err, ErrBadGuest) && !strings.Contains(err.Error(), "the driver set FAILED") {
		t.Fatalf("device stopped by something other than the guest: %v", err)
	}
}

// opSeq builds operation sequences for seeds.
type opSeq []byte

func (s opSeq) write32(off uint64, v uint32) opSeq {
	return binary.LittleEndian.AppendUint32(append(s, fuzzOpWrite|2<<2, byte(off), byte(off>>8)), v)
}

func (s opSeq) read(off uint64, sizeIdx byte) opSeq {
	return append(s, fuzzOpRead|sizeIdx<<2, byte(off), byte(off>>8))
}

func (s opSeq) poke(addr uint64, p []byte) opSeq {
	for len(p) > 0 {
		n := min(len(p), 255)
		s = append(append(s, fuzzOpPoke, byte(addr), byte(addr>>8), byte(n)), p[:n]...)
		p, addr = p[n:], addr+uint64(n)
	}
	return s
}

// Seed layout: queue q's rings at 0x400*q, buffers from 0x1000.
const seedQueueSize = 16

func seedDesc(q int) uint64  { return 0x400 * uint64(q) }
func seedAvail(q int) uint64 { return 0x400*uint64(q) + 0x100 }
func seedUsed(q int) uint64  { return 0x400*uint64(q) + 0x200 }

// setup is the driver's init sequence: reset, ACKNOWLEDGE, DRIVER,
// feature negotiation, every queue's size and rings, DRIVER_OK.
func (s opSeq) setup(dev Device) opSeq {
	feat := dev.Features() | FeatureVersion1
	s = s.write32(RegStatus, 0).read(RegMagic, 2).read(RegVersion, 2).read(RegDeviceID, 2)
	s = s.write32(RegStatus, StatusAcknowledge).write32(RegStatus, StatusAcknowledge|StatusDriver)
	s = s.write32(RegDeviceFeatSel, 1).read(RegDeviceFeatures, 2).write32(RegDeviceFeatSel, 0).read(RegDeviceFeatures, 2)
	s = s.write32(RegDriverFeatSel, 1).write32(RegDriverFeatures, uint32(feat>>32))
	s = s.write32(RegDriverFeatSel, 0).write32(RegDriverFeatures, uint32(feat))
	s = s.write32(RegStatus, StatusAcknowledge|StatusDriver|StatusFeaturesOK).read(RegStatus, 2)
	for q := range dev.QueueMax() {
		s = s.write32(RegQueueSel, uint32(q)).read(RegQueueNumMax, 2).write32(RegQueueNum, seedQueueSize)
		s = s.write32(RegQueueDescLow, uint32(seedDesc(q))).write32(RegQueueDescHigh, 0)
		s = s.write32(RegQueueAvailLow, uint32(seedAvail(q))).write32(RegQueueAvailHigh, 0)
		s = s.write32(RegQueueUsedLow, uint32(seedUsed(q))).write32(RegQueueUsedHigh, 0)
		s = s.write32(RegQueueReady, 1).read(RegQueueReady, 2)
	}
	return s.write32(RegStatus, StatusAcknowledge|StatusDriver|StatusFeaturesOK|StatusDriverOK)
}

// seedBuf is one descriptor of a seed chain: readable data, or a
// writable buffer of a size, at a guest address.
type seedBuf struct {
	addr     uint64
	data     []byte
	writable uint32
}

// chains stores the chains into queue q's descriptor table and available
// ring, one after another from descriptor 0, and notifies the queue.
func (s opSeq) chains(q int, chains ...[]seedBuf) opSeq {
	idx := uint16(0)
	avail := binary.LittleEndian.AppendUint16(binary.LittleEndian.AppendUint16(nil, 0), uint16(len(chains)))
	for _, c := range chains {
		avail = binary.LittleEndian.AppendUint16(avail, idx)
		for i, b := range c {
			n, flags := uint32(len(b.data)), uint16(0)
			if b.writable > 0 {
				n, flags = b.writable, DescWrite
			} else {
				s = s.poke(b.addr, b.data)
			}
			if i < len(c)-1 {
				flags |= DescNext
			}
			d := binary.LittleEndian.AppendUint64(nil, b.addr)
			d = binary.LittleEndian.AppendUint32(d, n)
			d = binary.LittleEndian.AppendUint16(d, flags)
			d = binary.LittleEndian.AppendUint16(d, idx+1)
			s = s.poke(seedDesc(q)+16*uint64(idx), d)
			idx++
		}
	}
	return s.poke(seedAvail(q), avail).write32(RegQueueNotify, uint32(q))
}

// transportSeed is a driver's init sequence and requests for one device
// kind, with the queues whose requests the device answers at once.
type transportSeed struct {
	ops    opSeq
	served []int
}

func transportSeeds() []transportSeed {
	var seeds []transportSeed
	add := func(kind byte, served []int, f func(s opSeq) opSeq) {
		dev, _, _ := fuzzDevice(kind)
		seeds = append(seeds, transportSeed{f(opSeq{kind}.setup(dev)), served})
	}
	add(0, []int{0}, func(s opSeq) opSeq {
		data := bytes.Repeat([]byte("tine"), 128)
		return s.read(RegConfig, 3).chains(0,
			[]seedBuf{{addr: 0x1000, data: blkHdr(BlkOut, 1)}, {addr: 0x1100, data: data}, {addr: 0x1400, writable: 1}},
			[]seedBuf{{addr: 0x1010, data: blkHdr(BlkIn, 1)}, {addr: 0x1800, writable: 512}, {addr: 0x1401, writable: 1}},
			[]seedBuf{{addr: 0x1020, data: blkHdr(BlkGetID, 0)}, {addr: 0x1a00, writable: 20}, {addr: 0x1402, writable: 1}},
		)
	})
	add(1, []int{0, 1}, func(s opSeq) opSeq {
		s = s.read(RegConfig, 0).read(RegConfig+4, 1)
		s = s.chains(0, []seedBuf{{addr: 0x2000, writable: 1526}})
		s = append(s, fuzzOpKick|fuzzHost, 6)
		return s.chains(1, []seedBuf{{addr: 0x1000, data: append(make([]byte, NetHeaderSize), frame(60, 1)...)}})
	})
	add(2, []int{0, 1, 2}, func(s opSeq) opSeq {
		h := VsockHeader{SrcCID: 3, DstCID: VsockHostCID, SrcPort: 40000, DstPort: 1, Type: VsockTypeStream, Op: VsockOpRequest, BufAlloc: 1 << 16}
		req := h.Append(nil)
		h.DstPort = 99
		s = s.read(RegConfig, 3)
		s = s.chains(2, []seedBuf{{addr: 0x1f00, writable: 4}})
		s = s.chains(0, []seedBuf{{addr: 0x2000, writable: 64}}, []seedBuf{{addr: 0x2100, writable: 64}})
		s = s.chains(1, []seedBuf{{addr: 0x1000, data: req}}, []seedBuf{{addr: 0x1100, data: h.Append(nil)}})
		return append(s, fuzzOpKick|fuzzHost, 0)
	})
	add(3, []int{0}, func(s opSeq) opSeq {
		in := make([]byte, fuseInHeaderSize+64)
		binary.LittleEndian.PutUint32(in, uint32(len(in)))
		binary.LittleEndian.PutUint32(in[4:], fuseInit)
		binary.LittleEndian.PutUint64(in[8:], 1)
		binary.LittleEndian.PutUint32(in[fuseInHeaderSize:], 7)
		forget := make([]byte, fuseInHeaderSize+8)
		binary.LittleEndian.PutUint32(forget, uint32(len(forget)))
		binary.LittleEndian.PutUint32(forget[4:], fuseForget)
		s = s.read(RegConfig, 2).read(RegConfig+FSTagSize, 2).read(RegShmLenLow, 2)
		s = s.chains(1, []seedBuf{{addr: 0x1000, data: in}, {addr: 0x2000, writable: 256}})
		return s.chains(0, []seedBuf{{addr: 0x1100, data: forget}})
	})
	add(4, []int{0, 1}, func(s opSeq) opSeq {
		s = s.chains(1, []seedBuf{{addr: 0x1000, data: []byte("hello ")}, {addr: 0x1100, data: []byte("world")}})
		return append(s.chains(0, []seedBuf{{addr: 0x2000, writable: 16}}), fuzzOpKick|fuzzHost, 20)
	})
	add(5, []int{0}, func(s opSeq) opSeq {
		s = s.chains(0, []seedBuf{{addr: 0x2000, writable: 64}}, []seedBuf{{addr: 0x2100, writable: 32}, {addr: 0x2200, writable: 32}})
		return append(s.read(RegInterruptStat, 2).write32(RegInterruptACK, IntUsedBuffer), fuzzOpKick, 0)
	})
	return seeds
}

// TestTransportSeeds: each seed sets its device up and gets its requests
// served, so the fuzz target starts from a working driver.
func TestTransportSeeds(t *testing.T) {
	for _, seed := range transportSeeds() {
		mem, err := runTransportOps(t, seed.ops)
		if err != nil {
			t.Fatalf("device kind %d failed: %v", seed.ops[0], err)
		}
		for _, q := range seed.served {
			if idx := le.Uint16(mem[seedUsed(q)+2:]); idx == 0 {
				t.Errorf("device kind %d: nothing used on queue %d", seed.ops[0], q)
			}
		}
	}
}

// FuzzTransport feeds a virtio-mmio transport in front of each device
// type (block over an in-memory disk, net, vsock, fs, console, rng) a
// sequence of at most maxFuzzOps guest operations: register reads and
// writes of any size at any offset, in the window, past it or below it;
// stores into the guest's four pages of RAM (descriptors, rings,
// requests); queue kicks; host input (a received frame, console input, a
// vsock transport reset). It asserts that nothing panics, that unknown
// registers and odd accesses read as zero and configuration reads match
// the device's configuration space, that live queues lie in guest RAM,
// that a device only fails for the guest's fault and a reset recovers
// it, and that RAM around the guest's is never written.
func FuzzTransport(f *testing.F) {
	for _, s := range transportSeeds() {
		f.Add([]byte(s.ops))
	}
	// Odd sizes and offsets far outside the window.
	f.Add([]byte{0, fuzzOpRead | 5<<2, 0x70, 0, fuzzOpWrite | 6<<2 | 3<<5, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
		fuzzOpRead | 3<<2 | 2<<5, 0xff, 0xff, fuzzOpRead | 1<<2 | 3<<5, 0, 0, fuzzOpKick, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		runTransportOps(t, data)
	})
}
