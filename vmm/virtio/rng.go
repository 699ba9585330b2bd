package virtio

import (
	"crypto/rand"
	"io"
)

// MaxRNGRequest bounds the bytes one rng request gets; a larger buffer is
// filled only this far.
const MaxRNGRequest = 64 << 10

// maxChainBytes bounds any chain a device accepts: at most the queue's
// descriptors, each at most 4 GiB, add up to more than a host should
// walk. Devices pass their own bound.
const maxPerNotify = 1 << 16

// RNG is a virtio entropy device (type 4): each writable buffer the
// driver offers is filled from the host's random source.
type RNG struct {
	// Source is read for entropy; nil means crypto/rand.
	Source io.Reader
}

// Type implements Device.
func (r *RNG) Type() uint32 { return TypeRNG }

// Features implements Device.
func (r *RNG) Features() uint64 { return 0 }

// QueueMax implements Device.
func (r *RNG) QueueMax() []uint16 { return []uint16{MaxQueueSize} }

// ReadConfig implements Device: there is no configuration space.
func (r *RNG) ReadConfig(off uint64, data []byte) {}

// WriteConfig implements Device.
func (r *RNG) WriteConfig(off uint64, data []byte) {}

// Reset implements Device.
func (r *RNG) Reset() {}

// Notify implements Device.
func (r *RNG) Notify(t *Transport, q int) error {
	src := r.Source
	if src == nil {
		src = rand.Reader
	}
	qu := t.Queue(q)
	for range maxPerNotify {
		c, err := qu.Pop(t.Mem(), 1<<32)
		if err != nil || c == nil {
			return err
		}
		w := c.NewWriter()
		n := min(w.Room(), MaxRNGRequest)
		var buf [4096]byte
		for n > 0 {
			k := min(n, uint64(len(buf)))
			if _, err := io.ReadFull(src, buf[:k]); err != nil {
				return err
			}
			w.Write(buf[:k])
			n -= k
		}
		if err := t.Used(q, c.Head, w.Written()); err != nil {
			return err
		}
	}
	return nil
}
