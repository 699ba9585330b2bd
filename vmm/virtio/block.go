package virtio

import (
	"encoding/binary"
	"fmt"
	"io"
)

// Disk is what a block device reads and writes: a fixed-size image.
type Disk interface {
	io.ReaderAt
	io.WriterAt
	// Size is the image size in bytes, a multiple of 512.
	Size() int64
	// Flush makes completed writes durable.
	Flush() error
}

// virtio-blk request types, status values and features.
const (
	BlkIn    = 0
	BlkOut   = 1
	BlkFlush = 4
	BlkGetID = 8

	BlkOK     = 0
	BlkIOErr  = 1
	BlkUnsupp = 2

	BlkFeatureFlush = 1 << 9
	BlkFeatureRO    = 1 << 5

	blkHeaderSize = 16
	sectorSize    = 512
	// MaxBlockRequest bounds one request's data.
	MaxBlockRequest = 4 << 20
)

// BlockRequest is a decoded request header.
type BlockRequest struct {
	Type   uint32
	Sector uint64
}

// DecodeBlockRequest decodes the 16-byte request header.
func DecodeBlockRequest(b []byte) (BlockRequest, error) {
	if len(b) < blkHeaderSize {
		return BlockRequest{}, fmt.Errorf("%w: block request header of %d bytes, want %d", ErrBadGuest, len(b), blkHeaderSize)
	}
	return BlockRequest{Type: binary.LittleEndian.Uint32(b), Sector: binary.LittleEndian.Uint64(b[8:])}, nil
}

// Block is a virtio block device (type 2) over a Disk.
type Block struct {
	Disk Disk
	// ReadOnly refuses writes (VIRTIO_BLK_F_RO).
	ReadOnly bool
	// ID is returned for GET_ID (at most 20 bytes are used).
	ID string

	buf []byte
}

// Type implements Device.
func (b *Block) Type() uint32 { return TypeBlock }

// Features implements Device.
func (b *Block) Features() uint64 {
	if b.ReadOnly {
		return BlkFeatureFlush | BlkFeatureRO
	}
	return BlkFeatureFlush
}

// QueueMax implements Device.
func (b *Block) QueueMax() []uint16 { return []uint16{MaxQueueSize} }

// ReadConfig implements Device: capacity in 512-byte sectors at offset 0.
func (b *Block) ReadConfig(off uint64, data []byte) {
	var cfg [8]byte
	binary.LittleEndian.PutUint64(cfg[:], uint64(b.Disk.Size())/sectorSize)
	if off < uint64(len(cfg)) {
		copy(data, cfg[off:])
	}
}

// WriteConfig implements Device.
func (b *Block) WriteConfig(off uint64, data []byte) {}

// Reset implements Device.
func (b *Block) Reset() {}

// Notify implements Device.
func (b *Block) Notify(t *Transport, q int) error {
	qu := t.Queue(q)
	for range maxPerNotify {
		c, err := qu.Pop(t.Mem(), MaxBlockRequest+blkHeaderSize+1)
		if err != nil || c == nil {
			return err
		}
		n, err := b.handle(c)
		if err != nil {
			return err
		}
		if err := t.Used(q, c.Head, n); err != nil {
			return err
		}
	}
	return nil
}

// handle serves one request; it returns the bytes written to the chain.
// Malformed framing (no header, no status byte) is a device error; a bad
// sector range is an I/O error for that request, as the spec has it.
func (b *Block) handle(c *Chain) (uint32, error) {
	var hdr [blkHeaderSize]byte
	h := c.ReadAll(hdr[:0], blkHeaderSize)
	req, err := DecodeBlockRequest(h)
	if err != nil {
		return 0, err
	}
	if c.WriteLen == 0 {
		return 0, fmt.Errorf("%w: block request without a status byte", ErrBadGuest)
	}
	// The status byte is the last writable byte.
	last := c.Writable[len(c.Writable)-1]
	for len(last) == 0 {
		return 0, fmt.Errorf("%w: block request whose last writable buffer is empty", ErrBadGuest)
	}
	status := &last[len(last)-1]
	data := c.WriteLen - 1
	in := c.Writable
	var written uint32
	st := byte(BlkOK)
	switch req.Type {
	case BlkIn:
		st, written = b.read(req.Sector, in, data)
	case BlkOut:
		st = b.write(req.Sector, c, blkHeaderSize)
	case BlkFlush:
		if err := b.Disk.Flush(); err != nil {
			st = BlkIOErr
		}
	case BlkGetID:
		w := (&Chain{Writable: in}).NewWriter()
		id := []byte(b.ID)
		id = id[:min(len(id), 20, int(data))]
		w.Write(id)
		written = w.Written()
	default:
		st = BlkUnsupp
	}
	*status = st
	return written + 1, nil
}

func (b *Block) span(sector, n uint64) (int64, bool) {
	if n%sectorSize != 0 || sector > uint64(b.Disk.Size())/sectorSize {
		return 0, false
	}
	off := sector * sectorSize
	if off+n > uint64(b.Disk.Size()) {
		return 0, false
	}
	return int64(off), true
}

func (b *Block) read(sector uint64, segs []Seg, n uint64) (byte, uint32) {
	off, ok := b.span(sector, n)
	if !ok {
		return BlkIOErr, 0
	}
	var done uint64
	for _, s := range segs {
		k := min(uint64(len(s)), n-done)
		if k == 0 {
			break
		}
		if _, err := b.Disk.ReadAt(s[:k], off+int64(done)); err != nil {
			return BlkIOErr, uint32(done)
		}
		done += k
	}
	return BlkOK, uint32(done)
}

func (b *Block) write(sector uint64, c *Chain, skip uint64) byte {
	if b.ReadOnly {
		return BlkIOErr
	}
	if c.ReadLen < skip {
		return BlkIOErr
	}
	n := c.ReadLen - skip
	off, ok := b.span(sector, n)
	if !ok {
		return BlkIOErr
	}
	// The guest may change its buffers while they are written: the disk
	// gets whatever they held, which is the guest's own business. Copy
	// through a bounded buffer so the disk never holds guest RAM.
	if b.buf == nil {
		b.buf = make([]byte, 64<<10)
	}
	pos := int64(0)
	for _, s := range c.Readable {
		if skip >= uint64(len(s)) {
			skip -= uint64(len(s))
			continue
		}
		s = s[skip:]
		skip = 0
		for len(s) > 0 {
			k := copy(b.buf, s)
			if _, err := b.Disk.WriteAt(b.buf[:k], off+pos); err != nil {
				return BlkIOErr
			}
			pos += int64(k)
			s = s[k:]
		}
	}
	return BlkOK
}
