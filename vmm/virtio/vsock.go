package virtio

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// vsock packet operations, types and constants.
const (
	VsockOpRequest       = 1
	VsockOpResponse      = 2
	VsockOpRST           = 3
	VsockOpShutdown      = 4
	VsockOpRW            = 5
	VsockOpCreditUpdate  = 6
	VsockOpCreditRequest = 7

	VsockTypeStream = 1

	// VsockHostCID is the host's context id.
	VsockHostCID = 2
	// VsockHeaderSize is the size of a packet header.
	VsockHeaderSize = 44
	// MaxVsockPayload bounds one packet's data.
	MaxVsockPayload = 64 << 10
	// MaxVsockConns bounds the host connections of one device.
	MaxVsockConns = 256
	// MaxVsockGuestConns bounds the connections the guest has open to
	// exposed host ports at once (Expose); a request beyond gets RST.
	MaxVsockGuestConns = 64
	// vsockBufAlloc is the receive buffer the host advertises per
	// connection: the most guest data it holds for a slow host client.
	vsockBufAlloc = 64 << 10
	// maxVsockControl bounds the control packets waiting for receive
	// buffers.
	maxVsockControl = 1024

	vsockEventTransportReset = 0
)

// VsockHeader is a decoded virtio-vsock packet header.
type VsockHeader struct {
	SrcCID, DstCID   uint64
	SrcPort, DstPort uint32
	Len              uint32
	Type, Op         uint16
	Flags            uint32
	BufAlloc, FwdCnt uint32
}

// DecodeVsockHeader decodes a packet header; the length must be within
// MaxVsockPayload.
func DecodeVsockHeader(b []byte) (VsockHeader, error) {
	if len(b) < VsockHeaderSize {
		return VsockHeader{}, fmt.Errorf("%w: vsock header of %d bytes, want %d", ErrBadGuest, len(b), VsockHeaderSize)
	}
	h := VsockHeader{
		SrcCID: le.Uint64(b), DstCID: le.Uint64(b[8:]),
		SrcPort: le.Uint32(b[16:]), DstPort: le.Uint32(b[20:]),
		Len: le.Uint32(b[24:]), Type: le.Uint16(b[28:]), Op: le.Uint16(b[30:]),
		Flags: le.Uint32(b[32:]), BufAlloc: le.Uint32(b[36:]), FwdCnt: le.Uint32(b[40:]),
	}
	if h.Len > MaxVsockPayload {
		return h, fmt.Errorf("%w: vsock packet of %d bytes, at most %d", ErrBadGuest, h.Len, MaxVsockPayload)
	}
	return h, nil
}

// Append encodes h after b.
func (h VsockHeader) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, h.SrcCID)
	b = binary.LittleEndian.AppendUint64(b, h.DstCID)
	b = binary.LittleEndian.AppendUint32(b, h.SrcPort)
	b = binary.LittleEndian.AppendUint32(b, h.DstPort)
	b = binary.LittleEndian.AppendUint32(b, h.Len)
	b = binary.LittleEndian.AppendUint16(b, h.Type)
	b = binary.LittleEndian.AppendUint16(b, h.Op)
	b = binary.LittleEndian.AppendUint32(b, h.Flags)
	b = binary.LittleEndian.AppendUint32(b, h.BufAlloc)
	return binary.LittleEndian.AppendUint32(b, h.FwdCnt)
}

// Vsock is a virtio socket device (type 19) in userspace. Its host side is
// one Unix socket: a host client connects, writes "CONNECT <port>\n",
// and once the guest accepts reads "OK <host port>\n"; after that the
// Unix connection carries the stream. The guest can connect to the host
// (CID 2) only on the ports given to Expose. Queue 0 is receive, 1
// transmit, 2 events.
type Vsock struct {
	// GuestCID is the guest's context id (3 or more).
	GuestCID uint64

	t         *Transport
	ln        net.Listener
	conns     map[uint32]*vconn // host clients' connections, by host port
	gconns    map[vkey]*vconn   // the guest's connections to exposed ports
	emu       sync.Mutex
	exposed   map[uint32]func() (net.Conn, error) // by host port, under emu
	control   [][]byte                            // encoded headers waiting for rx buffers
	order     []*vconn                            // connections with data waiting
	nextPort  uint32
	resetWait bool
	txbuf     []byte
	closed    bool
}

type vconn struct {
	v                  *Vsock
	c                  net.Conn // nil while a guest's connection is dialed
	host, guest        uint32
	fromGuest          bool // the guest connected to an exposed port
	established        bool
	peerAlloc, peerFwd uint32 // guest's receive credit
	txCnt              uint32 // bytes sent to the guest
	rxCnt, fwdCnt      uint32 // bytes from the guest, and written to the client
	lastFwd            uint32 // fwdCnt in the last credit update
	data               []byte // read from the client, waiting for the guest
	wmu                sync.Mutex
	wq                 [][]byte
	wsig, rsig         chan struct{}
	gone               bool
}

// Type implements Device.
func (v *Vsock) Type() uint32 { return TypeVsock }

// Features implements Device: stream sockets only.
func (v *Vsock) Features() uint64 { return 0 }

// QueueMax implements Device.
func (v *Vsock) QueueMax() []uint16 { return []uint16{MaxQueueSize, MaxQueueSize, MaxQueueSize} }

// ReadConfig implements Device: guest_cid, 8 bytes.
func (v *Vsock) ReadConfig(off uint64, data []byte) {
	var cfg [8]byte
	binary.LittleEndian.PutUint64(cfg[:], v.GuestCID)
	if off < 8 {
		copy(data, cfg[off:])
	}
}

// WriteConfig implements Device.
func (v *Vsock) WriteConfig(off uint64, data []byte) {}

// Reset implements Device: every connection is dropped, the guest's to
// exposed ports too.
func (v *Vsock) Reset() {
	for _, c := range v.conns {
		v.drop(c, false)
	}
	for _, c := range v.gconns {
		v.drop(c, false)
	}
	v.control, v.order, v.resetWait = nil, nil, false
}

// Listen serves host clients on the Unix socket at path until Close. t
// is the device's transport.
func (v *Vsock) Listen(t *Transport, path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("vsock: listen on %s: %w", path, err)
	}
	v.t, v.ln = t, ln
	if v.conns == nil {
		v.conns = map[uint32]*vconn{}
	}
	go v.accept(ln)
	return nil
}

// Close stops listening and drops every connection.
func (v *Vsock) Close() error {
	if v.ln != nil {
		v.ln.Close()
	}
	if v.t != nil {
		v.t.mu.Lock()
		v.closed = true
		v.Reset()
		v.t.mu.Unlock()
	}
	return nil
}

func (v *Vsock) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go v.handshake(c)
	}
}

// handshake reads "CONNECT <port>\n" and asks the guest to connect.
func (v *Vsock) handshake(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReaderSize(&io1{c}, 64).ReadString('\n')
	c.SetReadDeadline(time.Time{})
	f := strings.Fields(line)
	var port uint64
	if err == nil && len(f) == 2 && f[0] == "CONNECT" {
		port, err = strconv.ParseUint(f[1], 10, 32)
	} else if err == nil {
		err = fmt.Errorf("want CONNECT <port>")
	}
	if err != nil {
		fmt.Fprintf(c, "ERR %v\n", err)
		c.Close()
		return
	}
	ok := false
	v.t.mu.Lock()
	if v.t.Ready() && !v.closed && len(v.conns) < MaxVsockConns {
		for v.conns[v.nextPort] != nil || v.nextPort < 1024 || v.isExposed(v.nextPort) {
			v.nextPort++
			if v.nextPort == 0 {
				v.nextPort = 1024
			}
		}
		vc := &vconn{v: v, c: c, host: v.nextPort, guest: uint32(port), wsig: make(chan struct{}, 1), rsig: make(chan struct{}, 1)}
		v.nextPort++
		v.conns[vc.host] = vc
		v.sendControl(vc, VsockOpRequest, 0)
		if err := v.deliver(); err != nil {
			v.t.fail(err)
		}
		ok = true
	}
	v.t.mu.Unlock()
	if !ok {
		fmt.Fprintf(c, "ERR the guest's vsock device is not ready or has too many connections\n")
		c.Close()
	}
}

// io1 reads one byte at a time so the handshake never consumes stream
// data after the newline.
type io1 struct{ c net.Conn }

func (r *io1) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return r.c.Read(p)
}

func (v *Vsock) header(vc *vconn, op uint16, n uint32) VsockHeader {
	return VsockHeader{SrcCID: VsockHostCID, DstCID: v.GuestCID, SrcPort: vc.host, DstPort: vc.guest,
		Len: n, Type: VsockTypeStream, Op: op, BufAlloc: vsockBufAlloc, FwdCnt: vc.fwdCnt}
}

func (v *Vsock) sendControl(vc *vconn, op uint16, flags uint32) {
	if len(v.control) >= maxVsockControl {
		return
	}
	h := v.header(vc, op, 0)
	h.Flags = flags
	v.control = append(v.control, h.Append(nil))
	if op == VsockOpCreditUpdate || op == VsockOpResponse || op == VsockOpRW {
		vc.lastFwd = vc.fwdCnt
	}
}

// drop closes a connection, telling the guest with RST when asked.
func (v *Vsock) drop(vc *vconn, rst bool) { v.end(vc, rst, false) }

// end closes a connection. With flush (the guest shut it down), data
// the guest sent before is still written to the client: the writer
// closes the connection once its queue is empty, and only the read side
// is shut now.
func (v *Vsock) end(vc *vconn, rst, flush bool) {
	if vc.gone {
		return
	}
	if rst {
		v.sendControl(vc, VsockOpRST, 0)
	}
	vc.gone = true
	v.forget(vc)
	if vc.c == nil {
		// A guest's connection still being dialed: the dial sees gone.
	} else if uc, ok := vc.c.(*net.UnixConn); ok && flush && vc.established {
		uc.CloseRead()
	} else {
		vc.c.Close()
	}
	signal(vc.rsig)
	signal(vc.wsig)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// ResetTransport drops every connection and sends the guest a
// TRANSPORT_RESET event, as after a restore or a fork: the guest's
// sockets to the host are reset, host clients reconnect.
func (v *Vsock) ResetTransport(t *Transport) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	v.Reset()
	v.resetWait = true
	if !t.Ready() {
		return nil
	}
	if err := v.sendEvents(t); err != nil {
		t.fail(err)
		return err
	}
	return nil
}

func (v *Vsock) sendEvents(t *Transport) error {
	if !v.resetWait || !t.queues[2].Ready {
		return nil
	}
	c, err := t.Queue(2).Pop(t.Mem(), 1<<16)
	if err != nil || c == nil {
		return err
	}
	var ev [4]byte
	binary.LittleEndian.PutUint32(ev[:], vsockEventTransportReset)
	w := c.NewWriter()
	if _, err := w.Write(ev[:]); err != nil {
		return err
	}
	v.resetWait = false
	return t.Used(2, c.Head, w.Written())
}

// Notify implements Device.
func (v *Vsock) Notify(t *Transport, q int) error {
	if v.t != t {
		// Written once: the connections' goroutines read v.t unlocked.
		v.t = t
	}
	if v.conns == nil {
		v.conns = map[uint32]*vconn{}
	}
	switch q {
	case 0:
		return v.deliver()
	case 1:
		qu := t.Queue(1)
		for range maxPerNotify {
			c, err := qu.Pop(t.Mem(), VsockHeaderSize+MaxVsockPayload)
			if err != nil || c == nil {
				if err == nil {
					err = v.deliver()
				}
				return err
			}
			v.txbuf = c.ReadAll(v.txbuf, VsockHeaderSize+MaxVsockPayload)
			if err := v.packet(v.txbuf); err != nil {
				return err
			}
			if err := t.Used(1, c.Head, 0); err != nil {
				return err
			}
		}
		return v.deliver()
	default:
		return v.sendEvents(t)
	}
}

// packet handles one packet from the guest. Protocol errors about one
// connection reset that connection; only malformed framing fails the
// device.
func (v *Vsock) packet(b []byte) error {
	h, err := DecodeVsockHeader(b)
	if err != nil {
		return err
	}
	if uint32(len(b)-VsockHeaderSize) != h.Len {
		return fmt.Errorf("%w: vsock header says %d bytes, the buffers hold %d", ErrBadGuest, h.Len, len(b)-VsockHeaderSize)
	}
	data := b[VsockHeaderSize:]
	if h.DstCID != VsockHostCID || h.SrcCID != v.GuestCID || h.Type != VsockTypeStream {
		return nil // not for the host: dropped, as the spec allows
	}
	vc := v.lookup(h.DstPort, h.SrcPort)
	if vc == nil {
		if h.Op == VsockOpRequest && v.acceptGuest(h) {
			return nil
		}
		if h.Op != VsockOpRST && len(v.control) < maxVsockControl {
			r := VsockHeader{SrcCID: VsockHostCID, DstCID: v.GuestCID, SrcPort: h.DstPort, DstPort: h.SrcPort,
				Type: VsockTypeStream, Op: VsockOpRST}
			v.control = append(v.control, r.Append(nil))
		}
		return nil
	}
	vc.peerAlloc, vc.peerFwd = h.BufAlloc, h.FwdCnt
	switch h.Op {
	case VsockOpResponse:
		if vc.fromGuest {
			v.drop(vc, true) // the guest asked; only the host answers
			return nil
		}
		if !vc.established {
			vc.established = true
			fmt.Fprintf(vc.c, "OK %d\n", vc.host)
			go vc.reader()
			go vc.writer()
		}
	case VsockOpRW:
		if !vc.established {
			v.drop(vc, true)
			return nil
		}
		if vc.rxCnt-vc.fwdCnt+h.Len > vsockBufAlloc {
			v.drop(vc, true) // past the credit it was given
			return nil
		}
		vc.rxCnt += h.Len
		if len(data) > 0 {
			vc.wmu.Lock()
			vc.wq = append(vc.wq, append([]byte(nil), data...))
			vc.wmu.Unlock()
			signal(vc.wsig)
		}
	case VsockOpCreditRequest:
		v.sendControl(vc, VsockOpCreditUpdate, 0)
	case VsockOpShutdown, VsockOpRST:
		v.end(vc, h.Op == VsockOpShutdown, true)
		return nil
	case VsockOpRequest:
		v.drop(vc, true)
		return nil
	}
	signal(vc.rsig) // credit may have changed
	return nil
}

// credit is how many bytes the guest can take now on vc.
func (vc *vconn) credit() uint32 {
	used := vc.txCnt - vc.peerFwd
	if used >= vc.peerAlloc {
		return 0
	}
	return vc.peerAlloc - used
}

// deliver fills the guest's receive buffers: control packets first, then
// data of connections in arrival order.
func (v *Vsock) deliver() error {
	t := v.t
	if t == nil || !t.queues[0].Ready {
		return nil
	}
	q := t.Queue(0)
	for {
		for len(v.order) > 0 && v.order[0].gone {
			v.order = v.order[1:]
		}
		if len(v.control) == 0 && len(v.order) == 0 {
			return nil
		}
		ok, err := q.Pending(t.Mem())
		if err != nil || !ok {
			return err
		}
		c, err := q.Pop(t.Mem(), VsockHeaderSize+MaxVsockPayload)
		if err != nil {
			return err
		}
		w := c.NewWriter()
		if len(v.control) > 0 {
			w.Write(v.control[0])
			v.control = v.control[1:]
		} else {
			vc := v.order[0]
			room := w.Room()
			if room <= VsockHeaderSize {
				return fmt.Errorf("%w: vsock receive buffer of %d bytes", ErrBadGuest, room)
			}
			n := min(uint64(len(vc.data)), room-VsockHeaderSize)
			w.Write(v.header(vc, VsockOpRW, uint32(n)).Append(nil))
			w.Write(vc.data[:n])
			vc.lastFwd = vc.fwdCnt
			vc.txCnt += uint32(n)
			vc.data = vc.data[n:]
			if len(vc.data) == 0 {
				v.order = v.order[1:]
				signal(vc.rsig)
			}
		}
		if err := t.Used(0, c.Head, w.Written()); err != nil {
			return err
		}
	}
}

// reader moves client bytes to the guest as its credit allows.
func (vc *vconn) reader() {
	v := vc.v
	buf := make([]byte, 32<<10)
	for {
		v.t.mu.Lock()
		gone, busy, credit := vc.gone, len(vc.data) > 0, vc.credit()
		v.t.mu.Unlock()
		if gone {
			return
		}
		if busy || credit == 0 {
			<-vc.rsig
			continue
		}
		n, err := vc.c.Read(buf[:min(int(credit), len(buf))])
		v.t.mu.Lock()
		if n > 0 && !vc.gone {
			vc.data = append(vc.data[:0], buf[:n]...)
			v.order = append(v.order, vc)
		}
		if err != nil && !vc.gone {
			if errors.Is(err, net.ErrClosed) {
				v.drop(vc, true)
			} else {
				v.sendControl(vc, VsockOpShutdown, 3)
				vc.gone = true
				v.forget(vc)
				signal(vc.wsig)
			}
		}
		if err := v.deliver(); err != nil {
			v.t.fail(err)
		}
		v.t.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// writer moves guest bytes to the client and returns credit.
func (vc *vconn) writer() {
	v := vc.v
	for {
		vc.wmu.Lock()
		q := vc.wq
		vc.wq = nil
		vc.wmu.Unlock()
		if len(q) == 0 {
			// Guest data is queued with the transport's lock held, so
			// under it "gone with nothing queued" is final.
			v.t.mu.Lock()
			vc.wmu.Lock()
			gone, empty := vc.gone, len(vc.wq) == 0
			vc.wmu.Unlock()
			v.t.mu.Unlock()
			if gone && empty {
				vc.c.Close()
				return
			}
			if empty {
				<-vc.wsig
			}
			continue
		}
		var n uint32
		var werr error
		for _, b := range q {
			if werr == nil {
				_, werr = vc.c.Write(b)
			}
			n += uint32(len(b))
		}
		v.t.mu.Lock()
		vc.fwdCnt += n
		if werr != nil {
			v.drop(vc, true)
		} else if !vc.gone && vc.fwdCnt-vc.lastFwd >= vsockBufAlloc/4 {
			v.sendControl(vc, VsockOpCreditUpdate, 0)
		}
		if err := v.deliver(); err != nil {
			v.t.fail(err)
		}
		v.t.mu.Unlock()
	}
}
