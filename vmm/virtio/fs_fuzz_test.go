package virtio

import (
	"encoding/binary"
	"testing"
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
