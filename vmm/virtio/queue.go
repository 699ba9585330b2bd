package virtio

import (
	"fmt"
)

// Descriptor flags (virtq_desc.flags).
const (
	DescNext     = 1
	DescWrite    = 2
	DescIndirect = 4
)

// MaxQueueSize is the largest queue a device offers (QueueNumMax).
const MaxQueueSize = 256

const (
	descSize      = 16
	usedElemSize  = 8
	availFlagNoIR = 1 // VIRTQ_AVAIL_F_NO_INTERRUPT
)

// Queue is one split virtqueue, as the driver set it up through the
// transport. Every index and address in it comes from the guest and is
// checked on each use.
type Queue struct {
	// Size is the number of descriptors (a power of two, at most Max).
	Size uint16
	// Max is the most the device accepts (QueueNumMax).
	Max uint16
	// Desc, Avail and Used are the guest-physical addresses of the
	// descriptor table, the driver (available) ring and the device
	// (used) ring.
	Desc, Avail, Used uint64
	// Ready is set by the driver once the addresses are written.
	Ready bool

	// LastAvail is the next available-ring slot the device reads.
	LastAvail uint16
	// UsedIdx is the device's used-ring index.
	UsedIdx uint16
}

// Seg is one buffer of a chain: a window of guest RAM.
type Seg []byte

// Chain is one request: the readable (driver to device) buffers, then the
// writable ones, as one descriptor chain named by its head.
type Chain struct {
	Head     uint16
	Readable []Seg
	Writable []Seg
	// ReadLen and WriteLen are the total sizes of each side.
	ReadLen, WriteLen uint64
}

// Reset forgets the driver's setup.
func (q *Queue) Reset() {
	*q = Queue{Max: q.Max}
}

// check validates the queue's geometry against guest RAM.
func (q *Queue) check(mem Memory) error {
	if q.Size == 0 || q.Size > q.Max || q.Size&(q.Size-1) != 0 {
		return fmt.Errorf("%w: queue size %d is not a power of two up to %d", ErrBadGuest, q.Size, q.Max)
	}
	n := uint64(q.Size)
	if q.Desc%16 != 0 || q.Avail%2 != 0 || q.Used%4 != 0 {
		return fmt.Errorf("%w: misaligned rings (desc %#x, avail %#x, used %#x)", ErrBadGuest, q.Desc, q.Avail, q.Used)
	}
	if _, err := mem.Slice(q.Desc, n*descSize); err != nil {
		return fmt.Errorf("descriptor table: %w", err)
	}
	if _, err := mem.Slice(q.Avail, 6+2*n); err != nil {
		return fmt.Errorf("available ring: %w", err)
	}
	if _, err := mem.Slice(q.Used, 6+usedElemSize*n); err != nil {
		return fmt.Errorf("used ring: %w", err)
	}
	return nil
}

// Pending reports whether the driver made chains available that the
// device has not taken. A wrapped index (more than Size ahead) is an
// error.
func (q *Queue) Pending(mem Memory) (bool, error) {
	if err := q.check(mem); err != nil {
		return false, err
	}
	idx := le.Uint16(mem[q.Avail+2:])
	ahead := idx - q.LastAvail
	if ahead > q.Size {
		return false, fmt.Errorf("%w: available index %d is %d ahead of %d, more than the queue size %d", ErrBadGuest, idx, ahead, q.LastAvail, q.Size)
	}
	return ahead != 0, nil
}

// Pop takes the next available chain. It returns nil, nil when there is
// none. The segments alias guest RAM: the guest may change them while the
// device reads, so a device copies what it must validate before using it.
// Chains longer than the queue (a loop), descriptors outside RAM,
// indirect descriptors (not offered), readable descriptors after writable
// ones, and chains over maxBytes are errors.
func (q *Queue) Pop(mem Memory, maxBytes uint64) (*Chain, error) {
	ok, err := q.Pending(mem)
	if err != nil || !ok {
		return nil, err
	}
	slot := uint64(q.LastAvail % q.Size)
	head := le.Uint16(mem[q.Avail+4+2*slot:])
	q.LastAvail++
	c, err := q.walk(mem, head, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("chain at head %d: %w", head, err)
	}
	return c, nil
}

func (q *Queue) walk(mem Memory, head uint16, maxBytes uint64) (*Chain, error) {
	if head >= q.Size {
		return nil, fmt.Errorf("%w: head index %d outside the queue of %d", ErrBadGuest, head, q.Size)
	}
	c := &Chain{Head: head}
	i := head
	for n := 0; ; n++ {
		if n >= int(q.Size) {
			return nil, fmt.Errorf("%w: chain longer than the queue (%d): a loop", ErrBadGuest, q.Size)
		}
		d := mem[q.Desc+uint64(i)*descSize:]
		addr, ln, flags, next := le.Uint64(d), le.Uint32(d[8:]), le.Uint16(d[12:]), le.Uint16(d[14:])
		if flags&DescIndirect != 0 {
			return nil, fmt.Errorf("%w: descriptor %d is indirect, which the device did not offer", ErrBadGuest, i)
		}
		seg, err := mem.Slice(addr, uint64(ln))
		if err != nil {
			return nil, fmt.Errorf("descriptor %d: %w", i, err)
		}
		if flags&DescWrite != 0 {
			c.Writable = append(c.Writable, seg)
			c.WriteLen += uint64(ln)
		} else {
			if len(c.Writable) > 0 {
				return nil, fmt.Errorf("%w: descriptor %d is readable after a writable one", ErrBadGuest, i)
			}
			c.Readable = append(c.Readable, seg)
			c.ReadLen += uint64(ln)
		}
		if c.ReadLen+c.WriteLen > maxBytes {
			return nil, fmt.Errorf("%w: chain of more than %d bytes", ErrBadGuest, maxBytes)
		}
		if flags&DescNext == 0 {
			return c, nil
		}
		if next >= q.Size {
			return nil, fmt.Errorf("%w: descriptor %d links to %d, outside the queue of %d", ErrBadGuest, i, next, q.Size)
		}
		i = next
	}
}

// Push returns a chain to the driver with the number of bytes the device
// wrote into its writable buffers.
func (q *Queue) Push(mem Memory, head uint16, written uint32) error {
	if err := q.check(mem); err != nil {
		return err
	}
	slot := uint64(q.UsedIdx % q.Size)
	e := mem[q.Used+4+usedElemSize*slot:]
	le.PutUint32(e, uint32(head))
	le.PutUint32(e[4:], written)
	q.UsedIdx++
	le.PutUint16(mem[q.Used+2:], q.UsedIdx)
	return nil
}

// NeedsInterrupt reports whether the driver wants an interrupt for used
// buffers (it did not set VIRTQ_AVAIL_F_NO_INTERRUPT).
func (q *Queue) NeedsInterrupt(mem Memory) bool {
	if q.check(mem) != nil {
		return true
	}
	return le.Uint16(mem[q.Avail:])&availFlagNoIR == 0
}

// ReadAll copies up to max bytes of a chain's readable side into dst (a
// reused buffer) and returns it.
func (c *Chain) ReadAll(dst []byte, max int) []byte {
	dst = dst[:0]
	for _, s := range c.Readable {
		if len(dst)+len(s) > max {
			s = s[:max-len(dst)]
		}
		dst = append(dst, s...)
		if len(dst) == max {
			break
		}
	}
	return dst
}

// Writer writes into a chain's writable side, in order.
type Writer struct {
	segs []Seg
	n    uint32
}

// NewWriter returns a writer over c's writable buffers.
func (c *Chain) NewWriter() *Writer { return &Writer{segs: append([]Seg(nil), c.Writable...)} }

// Write copies p into the writable buffers; it writes what fits and
// reports a short write when they are full.
func (w *Writer) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 && len(w.segs) > 0 {
		k := copy(w.segs[0], p)
		w.segs[0] = w.segs[0][k:]
		if len(w.segs[0]) == 0 {
			w.segs = w.segs[1:]
		}
		p = p[k:]
		total += k
	}
	w.n += uint32(total)
	if len(p) > 0 {
		return total, fmt.Errorf("%w: writable buffers full", ErrBadGuest)
	}
	return total, nil
}

// Written is how many bytes went into the chain.
func (w *Writer) Written() uint32 { return w.n }

// Room is how many bytes are left in the writable buffers.
func (w *Writer) Room() uint64 {
	var n uint64
	for _, s := range w.segs {
		n += uint64(len(s))
	}
	return n
}
