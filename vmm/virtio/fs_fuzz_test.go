package virtio

import (
	"bytes"
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzFSRequest feeds the virtio-fs request decoder, and the device's
// handling of a chain outside a session, arbitrary readable buffers: the
// decoded message must be exactly the header's length and inside the
// bounds, the answer must fit the writable side, and nothing panics.
func FuzzFSRequest(f *testing.F) {
	hdr := func(n uint32, op uint32) []byte {
		h := make([]byte, fuseInHeaderSize)
		binary.LittleEndian.PutUint32(h, n)
		binary.LittleEndian.PutUint32(h[4:], op)
		binary.LittleEndian.PutUint64(h[8:], 7)
		return h
	}
	f.Add([]byte{40}, hdr(40, opLookup), uint16(64))
	f.Add([]byte{10, 30}, hdr(46, opLookup), uint16(16))
	f.Add([]byte{40}, append(hdr(48, fuseForget), make([]byte, 8)...), uint16(0))
	f.Add([]byte{40}, hdr(1<<31, fuseInit), uint16(80))
	f.Add([]byte{3}, []byte{1, 2, 3}, uint16(8))
	f.Add([]byte{20, 20}, hdr(40, fuseDestroy), uint16(16))
	f.Fuzz(func(t *testing.T, splits, data []byte, room uint16) {
		c := &Chain{}
		for _, s := range splits {
			k := min(int(s), len(data))
			c.Readable = append(c.Readable, Seg(data[:k]))
			c.ReadLen += uint64(k)
			data = data[k:]
		}
		if len(data) > 0 {
			c.Readable = append(c.Readable, Seg(data))
			c.ReadLen += uint64(len(data))
		}
		req, msg, err := DecodeFSRequest(c, nil)
		if err == nil && (uint64(len(msg)) != uint64(req.Len) || req.Len < fuseInHeaderSize || len(msg) > MaxFSRequest || uint64(len(msg)) > c.ReadLen) {
			t.Fatalf("decoded %+v with a message of %d bytes from %d", req, len(msg), c.ReadLen)
		}
		w := make([]byte, room)
		c.Writable = []Seg{w}
		c.WriteLen = uint64(room)
		dev := &FS{}
		n, answered, herr := dev.handle(nil, 1, c)
		if (herr == nil) != (err == nil) {
			t.Fatalf("handle %v, decode %v", herr, err)
		}
		if answered && uint64(n) > c.WriteLen {
			t.Fatalf("answered %d bytes into %d", n, c.WriteLen)
		}
	})
}

// FuzzFSReply feeds the reply path arbitrary server output (a server a
// guest subverted is as hostile as the guest): what is written fits the
// chain, and is either the whole reply under the guest's unique or an
// EIO header.
func FuzzFSReply(f *testing.F) {
	rep := func(n uint32, body string) []byte {
		b := make([]byte, fuseOutHeaderSize, fuseOutHeaderSize+len(body))
		binary.LittleEndian.PutUint32(b, n)
		binary.LittleEndian.PutUint64(b[8:], 9)
		return append(b, body...)
	}
	f.Add(rep(20, "abcd"), uint16(64), uint16(0))
	f.Add(rep(20, "abcd"), uint16(10), uint16(10))
	f.Add(rep(99, "abcd"), uint16(64), uint16(0))
	f.Add(rep(16, ""), uint16(8), uint16(0))
	f.Add([]byte{1, 2}, uint16(64), uint16(0))
	f.Fuzz(func(t *testing.T, msg []byte, room1, room2 uint16) {
		w1, w2 := make([]byte, room1), make([]byte, room2)
		p := fsPending{unique: 77, w: []Seg{w1, w2}}
		n := fsReply(p, append([]byte(nil), msg...))
		out := append(append([]byte(nil), w1...), w2...)[:min(int(n), len(w1)+len(w2))]
		switch {
		case uint64(n) > uint64(room1)+uint64(room2):
			t.Fatalf("wrote %d into %d", n, int(room1)+int(room2))
		case n == 0:
			if int(room1)+int(room2) >= fuseOutHeaderSize {
				t.Fatal("no answer though a header fits")
			}
		case binary.LittleEndian.Uint64(out[8:]) != 77:
			t.Fatalf("unique %d", binary.LittleEndian.Uint64(out[8:]))
		case int(n) == len(msg):
			if !bytes.Equal(out[16:], msg[16:]) {
				t.Fatal("reply body changed")
			}
		case n != fuseOutHeaderSize || int32(binary.LittleEndian.Uint32(out[4:])) != -int32(unix.EIO):
			t.Fatalf("answer of %d bytes, error %d, for a reply of %d", n, int32(binary.LittleEndian.Uint32(out[4:])), len(msg))
		}
	})
}
