package virtio

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

// memDisk is a Disk in a byte slice.
type memDisk []byte

func (m memDisk) Size() int64  { return int64(len(m)) }
func (m memDisk) Flush() error { return nil }
func (m memDisk) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m)) {
		return 0, fmt.Errorf("out of range")
	}
	return copy(p, m[off:]), nil
}
func (m memDisk) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m)) {
		return 0, fmt.Errorf("out of range")
	}
	return copy(m[off:], p), nil
}

func blkHdr(typ uint32, sector uint64) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint32(b, typ)
	binary.LittleEndian.PutUint64(b[8:], sector)
	return b
}

func TestBlockReadWrite(t *testing.T) {
	disk := make(memDisk, 1<<20)
	dev := &Block{Disk: disk, ID: "tine-disk"}
	d := newTestDriver(t, dev, 4<<20)
	var cfg [8]byte
	d.tr.Read(testBase+RegConfig, cfg[:])
	if binary.LittleEndian.Uint64(cfg[:]) != 2048 {
		t.Fatalf("capacity %d sectors", binary.LittleEndian.Uint64(cfg[:]))
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 64) // 1024 bytes
	d.add(0, buf{data: blkHdr(BlkOut, 3)}, buf{data: data}, buf{writable: 1})
	d.notify(0)
	if !bytes.Equal(disk[3*512:3*512+1024], data) {
		t.Fatal("write did not reach the disk")
	}
	h := d.add(0, buf{data: blkHdr(BlkIn, 3)}, buf{writable: 1024}, buf{writable: 1})
	d.notify(0)
	u := d.used(0)
	if len(u) != 2 || u[1] != [2]uint32{uint32(h), 1025} {
		t.Fatalf("used %v", u)
	}
	if !bytes.Equal(d.descBuf(0, h+1), data) || d.descBuf(0, h+2)[0] != BlkOK {
		t.Fatal("read back differs")
	}
	// Out-of-range sectors and odd lengths are I/O errors for the
	// request, not failures of the device.
	for _, c := range []struct {
		sector uint64
		n      int
	}{{2047, 1024}, {^uint64(0) / 256, 512}, {0, 100}} {
		h := d.add(0, buf{data: blkHdr(BlkIn, c.sector)}, buf{writable: c.n}, buf{writable: 1})
		d.notify(0)
		if d.descBuf(0, h+2)[0] != BlkIOErr || d.failed() {
			t.Fatalf("sector %d len %d: status %d failed %v", c.sector, c.n, d.descBuf(0, h+2)[0], d.failed())
		}
	}
	h = d.add(0, buf{data: blkHdr(BlkGetID, 0)}, buf{writable: 20}, buf{writable: 1})
	d.notify(0)
	if !bytes.HasPrefix(d.descBuf(0, h+1), []byte("tine-disk")) {
		t.Fatal("GET_ID")
	}
	// A request with no status byte fails the device.
	d.add(0, buf{data: blkHdr(BlkIn, 0)})
	d.notify(0)
	if !d.failed() {
		t.Fatal("request without status accepted")
	}
}

func TestConsole(t *testing.T) {
	var out bytes.Buffer
	dev := &Console{Output: &out}
	d := newTestDriver(t, dev, 4<<20)
	d.add(1, buf{data: []byte("hello ")}, buf{data: []byte("world")})
	d.notify(1)
	if out.String() != "hello world" {
		t.Fatalf("console output %q", out.String())
	}
	dev.Send(d.tr, []byte("input"))
	h := d.add(0, buf{writable: 3})
	d.notify(0)
	h2 := d.add(0, buf{writable: 16})
	d.notify(0)
	if string(d.descBuf(0, h)) != "inp" || string(d.descBuf(0, h2)[:2]) != "ut" {
		t.Fatalf("console input %q %q", d.descBuf(0, h), d.descBuf(0, h2))
	}
	dev.Send(d.tr, make([]byte, 2*MaxConsoleBacklog))
	if dev.Dropped() != MaxConsoleBacklog {
		t.Fatalf("dropped %d", dev.Dropped())
	}
}

// FuzzBlockRequest feeds the block device arbitrary request chains: a
// header, data and status buffers of any content and size.
func FuzzBlockRequest(f *testing.F) {
	f.Add(blkHdr(BlkIn, 0), uint16(512), uint8(1))
	f.Add(blkHdr(BlkOut, 7), uint16(1024), uint8(1))
	f.Add(blkHdr(BlkOut, ^uint64(0)), uint16(512), uint8(1))
	f.Add(blkHdr(BlkGetID, 0), uint16(20), uint8(1))
	f.Add(blkHdr(99, 0), uint16(0), uint8(0))
	f.Add([]byte{1, 2}, uint16(5), uint8(3))
	f.Fuzz(func(t *testing.T, hdr []byte, dataLen uint16, statusLen uint8) {
		disk := make(memDisk, 64<<10)
		d := newTestDriver(t, &Block{Disk: disk, ID: "x"}, 2<<20)
		bufs := []buf{{data: hdr}}
		if binary.LittleEndian.Uint32(append(hdr, 0, 0, 0, 0)) == BlkOut {
			bufs = append(bufs, buf{data: make([]byte, dataLen)})
		} else if dataLen > 0 {
			bufs = append(bufs, buf{writable: int(dataLen)})
		}
		if statusLen > 0 {
			bufs = append(bufs, buf{writable: int(statusLen % 8)})
		}
		if len(hdr) == 0 || len(hdr) > 4096 {
			return
		}
		d.add(0, bufs...)
		d.notify(0)
		u := d.used(0)
		if !d.failed() && len(u) != 1 {
			t.Fatalf("request neither served nor failed: %v", u)
		}
	})
}
