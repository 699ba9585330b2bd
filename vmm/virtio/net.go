package virtio

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// virtio-net constants: the device type's features this device knows,
// the header every frame carries (struct virtio_net_hdr_v1, which
// VIRTIO_F_VERSION_1 makes 12 bytes), and the size bounds.
const (
	TypeNet = 1

	// NetFeatureMAC (VIRTIO_NET_F_MAC): the MAC is in configuration space.
	NetFeatureMAC = 1 << 5

	// NetHeaderSize is the size of the header before every frame.
	NetHeaderSize = 12
	// MaxNetPacket bounds one packet: the header and an Ethernet frame.
	MaxNetPacket = 65550
	// MaxNetFrame bounds one frame without the header.
	MaxNetFrame = MaxNetPacket - NetHeaderSize
	// minNetFrame is an Ethernet header: destination, source, type.
	minNetFrame = 14

	netGSONone = 0
)

// NetHeader is a decoded virtio-net header. Without offloads negotiated
// every field but NumBuffers is zero.
type NetHeader struct {
	Flags, GSOType                                 uint8
	HdrLen, GSOSize, CsumStart, CsumOffset, NumBuf uint16
}

// DecodeNetTx decodes a transmit request, the bytes a guest put in a
// transmit chain: the header, then one Ethernet frame. It refuses a
// request without a whole header, with an offload the device did not
// offer (checksum or segmentation), or with a frame shorter than an
// Ethernet header or longer than MaxNetFrame. The frame aliases b.
func DecodeNetTx(b []byte) (NetHeader, []byte, error) {
	if len(b) < NetHeaderSize {
		return NetHeader{}, nil, fmt.Errorf("%w: virtio-net request of %d bytes, shorter than its %d-byte header", ErrBadGuest, len(b), NetHeaderSize)
	}
	h := NetHeader{Flags: b[0], GSOType: b[1], HdrLen: le.Uint16(b[2:]), GSOSize: le.Uint16(b[4:]),
		CsumStart: le.Uint16(b[6:]), CsumOffset: le.Uint16(b[8:]), NumBuf: le.Uint16(b[10:])}
	if h.Flags != 0 || h.GSOType != netGSONone {
		return h, nil, fmt.Errorf("%w: virtio-net header asks for offloads (flags %#x, gso type %d) the device did not offer", ErrBadGuest, h.Flags, h.GSOType)
	}
	f := b[NetHeaderSize:]
	if len(f) < minNetFrame || len(f) > MaxNetFrame {
		return h, nil, fmt.Errorf("%w: Ethernet frame of %d bytes, want %d to %d", ErrBadGuest, len(f), minNetFrame, MaxNetFrame)
	}
	return h, f, nil
}

// Net is a virtio network device (type 1) with one queue pair (0
// receive, 1 transmit), a MAC in configuration space and no offloads.
// Its backend carries one Ethernet frame per Read and Write, such as a
// TAP device opened with IFF_TAP|IFF_NO_PI (OpenTap). Frames the guest
// cannot take (no receive buffers offered, buffers too small) wait one
// at a time; the reader stops reading the backend meanwhile, so the
// host's queue fills and drops instead.
type Net struct {
	// MAC is the device's address, read by the driver at probe.
	MAC net.HardwareAddr
	// Backend carries frames; Close closes it.
	Backend io.ReadWriteCloser

	t                   *Transport
	pending             []byte // a received frame waiting for a buffer
	room                chan struct{}
	done                chan struct{}
	stopped             chan struct{} // closed when the reader returned
	closeOnce           sync.Once
	txbuf               []byte
	rxDropped, txErrors uint64
}

// Type implements Device.
func (n *Net) Type() uint32 { return TypeNet }

// Features implements Device.
func (n *Net) Features() uint64 { return NetFeatureMAC }

// QueueMax implements Device.
func (n *Net) QueueMax() []uint16 { return []uint16{MaxQueueSize, MaxQueueSize} }

// ReadConfig implements Device: the 6-byte MAC at offset 0.
func (n *Net) ReadConfig(off uint64, data []byte) {
	var cfg [6]byte
	copy(cfg[:], n.MAC)
	if off < uint64(len(cfg)) {
		copy(data, cfg[off:])
	}
}

// WriteConfig implements Device: the MAC is read-only (no
// VIRTIO_NET_F_CTRL_MAC_ADDR); the guest sets its own address on its
// side.
func (n *Net) WriteConfig(off uint64, data []byte) {}

// Reset implements Device: a waiting frame is dropped.
func (n *Net) Reset() { n.dropPending() }

// Stats returns the frames dropped on receive (the guest offered no
// buffer large enough, or the device was not ready) and the transmit
// requests refused or not written to the backend.
func (n *Net) Stats() (rxDropped, txErrors uint64) {
	if n.t == nil {
		return n.rxDropped, n.txErrors
	}
	n.t.mu.Lock()
	defer n.t.mu.Unlock()
	return n.rxDropped, n.txErrors
}

// Start reads frames from the backend for the guest until Close; t is
// the device's transport.
func (n *Net) Start(t *Transport) {
	n.t = t
	n.room = make(chan struct{}, 1)
	n.done = make(chan struct{})
	n.stopped = make(chan struct{})
	go n.receive()
}

// Close closes the backend and returns once the device's reader
// stopped: it touches guest memory no more, so the machine may go.
func (n *Net) Close() error {
	var err error
	n.closeOnce.Do(func() {
		if n.done != nil {
			close(n.done)
		}
		if n.Backend != nil {
			err = n.Backend.Close()
		}
		if n.stopped != nil {
			<-n.stopped
		}
	})
	return err
}

func (n *Net) receive() {
	defer close(n.stopped)
	buf := make([]byte, MaxNetFrame)
	for {
		k, err := n.Backend.Read(buf)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) || isClosed(n.done) {
				return
			}
			// A transient error (the host's side of the link went
			// down): try again, without spinning.
			select {
			case <-n.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if k < minNetFrame {
			continue
		}
		wait := false
		n.t.Do(func() error {
			n.pending = buf[:k]
			err := n.deliver(n.t)
			wait = n.pending != nil
			return err
		})
		if !wait {
			continue
		}
		select {
		case <-n.room:
		case <-n.done:
			return
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// deliver puts the waiting frame into the guest's next receive buffer.
// A buffer too small for it drops the frame and leaves the buffer for
// the next one. Transport lock held.
func (n *Net) deliver(t *Transport) error {
	if n.pending == nil {
		return nil
	}
	q := t.Queue(0)
	c, err := q.Pop(t.Mem(), 1<<32)
	if err != nil || c == nil {
		return err
	}
	if c.WriteLen < uint64(NetHeaderSize+len(n.pending)) {
		n.rxDropped++
		n.pending = nil
		q.LastAvail-- // the buffer stays for the next frame
		return nil
	}
	var hdr [NetHeaderSize]byte
	le.PutUint16(hdr[10:], 1) // num_buffers: 1, as VERSION_1 without MRG_RXBUF asks
	w := c.NewWriter()
	w.Write(hdr[:])
	w.Write(n.pending)
	n.pending = nil
	return t.Used(0, c.Head, w.Written())
}

// dropPending drops a waiting frame and wakes the reader. Transport lock
// held.
func (n *Net) dropPending() {
	if n.pending == nil {
		return
	}
	n.pending = nil
	n.rxDropped++
	n.wake()
}

func (n *Net) wake() {
	if n.room != nil {
		select {
		case n.room <- struct{}{}:
		default:
		}
	}
}

// Notify implements Device: queue 0 got receive buffers, queue 1
// transmit requests. A malformed request is returned to the guest
// unsent and counted; only a malformed chain stops the device.
func (n *Net) Notify(t *Transport, q int) error {
	if q == 0 {
		had := n.pending != nil
		if err := n.deliver(t); err != nil {
			return err
		}
		if had && n.pending == nil {
			n.wake()
		}
		return nil
	}
	qu := t.Queue(q)
	for range maxPerNotify {
		c, err := qu.Pop(t.Mem(), MaxNetPacket)
		if err != nil || c == nil {
			return err
		}
		if n.txbuf == nil {
			n.txbuf = make([]byte, 0, MaxNetPacket)
		}
		// Copy before decoding: the guest may change its buffers.
		n.txbuf = c.ReadAll(n.txbuf, MaxNetPacket)
		if _, frame, err := DecodeNetTx(n.txbuf); err != nil {
			n.txErrors++
		} else if n.Backend == nil {
			n.txErrors++
		} else if _, err := n.Backend.Write(frame); err != nil {
			n.txErrors++
		}
		if err := t.Used(q, c.Head, 0); err != nil {
			return err
		}
	}
	return nil
}
