package virtio

import (
	"bufio"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// guestVsock plays the guest's side of the vsock device over the test
// driver.
type guestVsock struct {
	d        *testDriver
	dev      *Vsock
	lastData []byte
	rxOut    int // receive buffers posted and not used yet
}

func (g *guestVsock) postRx(n int) {
	// Under the transport's lock: the device's goroutines read the
	// rings.
	g.d.tr.mu.Lock()
	for range n {
		g.d.add(0, buf{writable: 4096 + VsockHeaderSize})
	}
	g.d.tr.mu.Unlock()
	g.rxOut += n
	g.d.notify(0)
}

// recv returns the packets the device put into receive buffers.
func (g *guestVsock) recv(t *testing.T) []VsockHeader {
	var out []VsockHeader
	g.d.tr.mu.Lock()
	defer g.d.tr.mu.Unlock()
	for _, u := range g.d.used(0) {
		b := g.d.descBuf(0, uint16(u[0]))[:u[1]]
		h, err := DecodeVsockHeader(b)
		if err != nil {
			t.Fatal(err)
		}
		h.Flags = uint32(len(b)) // keep the size for the data check
		out = append(out, h)
		g.rxOut--
		g.lastData = append(g.lastData[:0], b[VsockHeaderSize:]...)
	}
	return out
}

func (g *guestVsock) send(h VsockHeader, data []byte) {
	h.SrcCID, h.DstCID, h.Type, h.Len, h.BufAlloc = 3, VsockHostCID, VsockTypeStream, uint32(len(data)), 1<<20
	g.d.tr.mu.Lock()
	g.d.add(1, buf{data: h.Append(nil)}, buf{data: data})
	g.d.tr.mu.Unlock()
	g.d.notify(1)
}

func waitFor(t *testing.T, what string, f func() bool) {
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestVsockConnectAndReset(t *testing.T) {
	dev := &Vsock{GuestCID: 3}
	d := newTestDriver(t, dev, 8<<20)
	g := &guestVsock{d: d, dev: dev}
	path := filepath.Join(t.TempDir(), "vsock.sock")
	if err := dev.Listen(d.tr, path); err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	g.postRx(8)
	d.add(2, buf{writable: 4})
	d.notify(2)

	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("CONNECT 5000\n"))
	var req VsockHeader
	waitFor(t, "the connection request", func() bool {
		for _, h := range g.recv(t) {
			if h.Op == VsockOpRequest {
				req = h
				return true
			}
		}
		return false
	})
	if req.DstPort != 5000 || req.DstCID != 3 {
		t.Fatalf("request %+v", req)
	}
	g.send(VsockHeader{SrcPort: 5000, DstPort: req.SrcPort, Op: VsockOpResponse}, nil)
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "OK ") {
		t.Fatalf("handshake answer %q, %v", line, err)
	}
	c.Write([]byte("ping"))
	waitFor(t, "data from the client", func() bool {
		for _, h := range g.recv(t) {
			if h.Op == VsockOpRW && string(g.lastData) == "ping" {
				return true
			}
		}
		return false
	})
	g.send(VsockHeader{SrcPort: 5000, DstPort: req.SrcPort, Op: VsockOpRW}, []byte("pong"))
	got := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.Read(got); err != nil || string(got) != "pong" {
		t.Fatalf("client read %q, %v", got, err)
	}

	// A packet past the credit the host gave resets that connection only.
	// After a restore or fork: TRANSPORT_RESET on the event queue, and
	// the host client sees its connection closed.
	if err := dev.ResetTransport(d.tr); err != nil {
		t.Fatal(err)
	}
	d.tr.mu.Lock()
	ev := d.used(2)
	d.tr.mu.Unlock()
	if len(ev) != 1 || ev[0][1] != 4 {
		t.Fatalf("event queue %v", ev)
	}
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("client connection survived the transport reset")
	}
	if d.failed() {
		t.Fatal(d.tr.Err())
	}
}

func TestVsockHostileGuest(t *testing.T) {
	dev := &Vsock{GuestCID: 3}
	d := newTestDriver(t, dev, 8<<20)
	g := &guestVsock{d: d, dev: dev}
	// Packets to unknown ports, from a wrong CID, with a wrong type: no
	// failure, unknown ports get RST.
	g.send(VsockHeader{SrcPort: 1, DstPort: 99, Op: VsockOpRW}, []byte("x"))
	g.send(VsockHeader{SrcPort: 1, DstPort: 99, Op: VsockOpRequest}, nil)
	if d.failed() {
		t.Fatal(d.tr.Err())
	}
	// A length field that disagrees with the buffers fails the device.
	h := VsockHeader{SrcCID: 3, DstCID: 2, Type: 1, Op: VsockOpRW, Len: 1000}
	d.add(1, buf{data: h.Append(nil)}, buf{data: []byte("short")})
	d.notify(1)
	if !d.failed() {
		t.Fatal("length mismatch accepted")
	}
}

// FuzzVsockPacket feeds the vsock device arbitrary transmit chains (a
// header and data split over two descriptors) with receive buffers
// posted: the device answers, ignores or fails, never panics.
func FuzzVsockPacket(f *testing.F) {
	h := VsockHeader{SrcCID: 3, DstCID: 2, Type: 1, SrcPort: 5, DstPort: 1024}
	for _, op := range []uint16{VsockOpRequest, VsockOpResponse, VsockOpRST, VsockOpShutdown, VsockOpRW, VsockOpCreditUpdate, VsockOpCreditRequest, 99} {
		h.Op = op
		f.Add(h.Append(nil), []byte{})
	}
	h.Op, h.Len = VsockOpRW, 3
	f.Add(h.Append(nil), []byte("abc"))
	h.Len = 0xffffffff
	f.Add(h.Append(nil), []byte("abc"))
	f.Add([]byte{1, 2, 3}, []byte{})
	f.Fuzz(func(t *testing.T, hdr, data []byte) {
		if len(hdr) == 0 || len(hdr) > 1024 || len(data) > 8192 {
			return
		}
		dev := &Vsock{GuestCID: 3}
		d := newTestDriver(t, dev, 2<<20)
		// A request to port 1024 is taken and dialed.
		dev.Expose(1024, func() (net.Conn, error) {
			a, b := net.Pipe()
			b.Close()
			return a, nil
		})
		defer dev.Close()
		d.tr.mu.Lock()
		d.add(0, buf{writable: 128})
		d.tr.mu.Unlock()
		d.notify(0)
		bufs := []buf{{data: hdr}}
		if len(data) > 0 {
			bufs = append(bufs, buf{data: data})
		}
		d.tr.mu.Lock()
		d.add(1, bufs...)
		d.tr.mu.Unlock()
		d.notify(1)
		d.tr.mu.Lock()
		used := len(d.used(1))
		d.tr.mu.Unlock()
		if !d.failed() && used != 1 {
			t.Fatal("transmit chain neither used nor failed")
		}
	})
}

// TestVsockShutdownFlushes: data the guest sent just before shutting the
// connection down still reaches the client, then the client sees EOF.
func TestVsockShutdownFlushes(t *testing.T) {
	for range 20 {
		dev := &Vsock{GuestCID: 3}
		d := newTestDriver(t, dev, 8<<20)
		g := &guestVsock{d: d, dev: dev}
		path := filepath.Join(t.TempDir(), "vsock.sock")
		if err := dev.Listen(d.tr, path); err != nil {
			t.Fatal(err)
		}
		g.postRx(4)
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("CONNECT 7\n"))
		var req VsockHeader
		waitFor(t, "the connection request", func() bool {
			for _, h := range g.recv(t) {
				if h.Op == VsockOpRequest {
					req = h
					return true
				}
			}
			return false
		})
		g.send(VsockHeader{SrcPort: 7, DstPort: req.SrcPort, Op: VsockOpResponse}, nil)
		g.send(VsockHeader{SrcPort: 7, DstPort: req.SrcPort, Op: VsockOpRW}, []byte("last words"))
		g.send(VsockHeader{SrcPort: 7, DstPort: req.SrcPort, Op: VsockOpShutdown, Flags: 3}, nil)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil || !strings.HasSuffix(string(b), "last words") {
			t.Fatalf("client read %q, %v", b, err)
		}
		c.Close()
		dev.Close()
	}
}
