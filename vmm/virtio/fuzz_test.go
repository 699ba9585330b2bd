package virtio

import (
	"encoding/binary"
	"testing"
)

// FuzzQueuePop feeds the chain parser a descriptor table and available
// ring made of arbitrary bytes: it must return chains inside guest RAM or
// errors, never panic, and stop within the queue's size.
func FuzzQueuePop(f *testing.F) {
	seed := func(descs [][4]uint64, heads []uint16, idx uint16) []byte {
		b := make([]byte, 2+16*16+4+2*16)
		b[0] = 16
		for i, d := range descs {
			e := b[2+16*i:]
			binary.LittleEndian.PutUint64(e, d[0])
			binary.LittleEndian.PutUint32(e[8:], uint32(d[1]))
			binary.LittleEndian.PutUint16(e[12:], uint16(d[2]))
			binary.LittleEndian.PutUint16(e[14:], uint16(d[3]))
		}
		a := b[2+16*16:]
		binary.LittleEndian.PutUint16(a[2:], idx)
		for i, h := range heads {
			binary.LittleEndian.PutUint16(a[4+2*i:], h)
		}
		return b
	}
	f.Add(seed([][4]uint64{{0x8000, 64, DescWrite, 0}}, []uint16{0}, 1))
	f.Add(seed([][4]uint64{{0x8000, 8, DescNext, 1}, {0x9000, 8, DescWrite, 0}}, []uint16{0}, 1))
	f.Add(seed([][4]uint64{{0x8000, 8, DescNext, 1}, {0x9000, 8, DescNext, 0}}, []uint16{0}, 1))
	f.Add(seed([][4]uint64{{0xfffffffffffffff0, 64, 0, 0}}, []uint16{0}, 1))
	f.Add(seed([][4]uint64{{0x8000, 64, DescIndirect, 0}}, []uint16{0}, 1))
	f.Add(seed(nil, []uint16{0}, 0xffff))
	f.Fuzz(func(t *testing.T, data []byte) {
		mem := make(Memory, 64<<10)
		q := Queue{Max: 256, Desc: 0x1000, Avail: 0x3000, Used: 0x4000}
		if len(data) > 0 {
			q.Size = uint16(data[0]) + uint16(data[0]&1)<<8
			data = data[1:]
		}
		if len(data) > 0 {
			q.LastAvail = uint16(data[0])
			data = data[1:]
		}
		n := copy(mem[0x1000:0x3000], data)
		copy(mem[0x3000:0x4000], data[n:])
		for range 300 {
			c, err := q.Pop(mem, 1<<16)
			if err != nil || c == nil {
				return
			}
			var total uint64
			for _, s := range append(c.Readable, c.Writable...) {
				total += uint64(len(s))
			}
			if total != c.ReadLen+c.WriteLen || total > 1<<16 {
				t.Fatalf("chain totals %d vs %d+%d", total, c.ReadLen, c.WriteLen)
			}
			if err := q.Push(mem, c.Head, 0); err != nil {
				t.Fatal(err)
			}
		}
		t.Fatal("more pops than a wrapped index allows")
	})
}

// FuzzNetTx feeds the transmit decoder arbitrary requests (header and
// frame): it refuses them or returns a frame within the bounds that
// aliases the request after the header, and a header without offloads.
func FuzzNetTx(f *testing.F) {
	f.Add(append(make([]byte, NetHeaderSize), frame(60, 1)...))
	f.Add(append([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}, frame(60, 2)...))
	f.Add(append([]byte{0, 4, 0x36, 0, 0xa8, 5, 0, 0, 0, 0, 0, 0}, frame(1514, 3)...))
	f.Add(make([]byte, NetHeaderSize+13))
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, fr, err := DecodeNetTx(b)
		if err != nil {
			return
		}
		if h.Flags != 0 || h.GSOType != 0 {
			t.Fatalf("accepted offloads %+v", h)
		}
		if len(fr) < minNetFrame || len(fr) > MaxNetFrame || len(fr) != len(b)-NetHeaderSize {
			t.Fatalf("frame of %d bytes from a %d-byte request", len(fr), len(b))
		}
	})
}
