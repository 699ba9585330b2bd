package virtio

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// hostListener is a host Unix listener whose accepted connections come
// out of a channel.
func hostListener(t *testing.T) (string, chan net.Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "host.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 2*MaxVsockGuestConns)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			ch <- c
		}
	}()
	return path, ch
}

func dialUnix(path string) func() (net.Conn, error) {
	return func() (net.Conn, error) { return net.DialTimeout("unix", path, 5*time.Second) }
}

// waitPacket posts receive buffers until a packet matching f arrives.
func (g *guestVsock) waitPacket(t *testing.T, what string, f func(VsockHeader) bool) VsockHeader {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, h := range g.recv(t) {
			if f(h) {
				return h
			}
		}
		if g.rxOut < 8 {
			g.postRx(1)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
	return VsockHeader{}
}

// TestVsockGuestConnect: the guest connects to an exposed host port, the
// host listener gets the connection and data flows both ways; a port not
// exposed and a failing dial get RST; a transport reset drops the
// connection.
func TestVsockGuestConnect(t *testing.T) {
	dev := &Vsock{GuestCID: 3}
	d := newTestDriver(t, dev, 8<<20)
	g := &guestVsock{d: d, dev: dev}
	path, accepted := hostListener(t)
	dev.Expose(5005, dialUnix(path))
	dev.Expose(5006, func() (net.Conn, error) { return nil, errors.New("no host peer") })
	defer dev.Close()

	g.send(VsockHeader{SrcPort: 40000, DstPort: 5005, Op: VsockOpRequest}, nil)
	var hc net.Conn
	select {
	case hc = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the host listener got no connection")
	}
	g.waitPacket(t, "the response", func(h VsockHeader) bool {
		if h.Op == VsockOpRST {
			t.Fatalf("the request was reset: %+v", h)
		}
		return h.Op == VsockOpResponse && h.SrcPort == 5005 && h.DstPort == 40000 && h.SrcCID == VsockHostCID && h.DstCID == 3
	})
	g.send(VsockHeader{SrcPort: 40000, DstPort: 5005, Op: VsockOpRW}, []byte("hello host"))
	got := make([]byte, 10)
	hc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(hc, got); err != nil || string(got) != "hello host" {
		t.Fatalf("host read %q, %v", got, err)
	}
	hc.Write([]byte("hello guest"))
	g.waitPacket(t, "the host's data", func(h VsockHeader) bool {
		return h.Op == VsockOpRW && h.DstPort == 40000 && string(g.lastData) == "hello guest"
	})

	// A port not exposed, and a dial that fails: RST.
	for _, port := range []uint32{5007, 5006} {
		g.send(VsockHeader{SrcPort: 40001, DstPort: port, Op: VsockOpRequest}, nil)
		g.waitPacket(t, "RST", func(h VsockHeader) bool {
			if h.Op == VsockOpResponse && h.SrcPort == port {
				t.Fatalf("port %d answered", port)
			}
			return h.Op == VsockOpRST && h.SrcPort == port && h.DstPort == 40001
		})
	}
	// Withdrawn: RST too.
	dev.Expose(5005, nil)
	g.send(VsockHeader{SrcPort: 40002, DstPort: 5005, Op: VsockOpRequest}, nil)
	g.waitPacket(t, "RST on the withdrawn port", func(h VsockHeader) bool {
		return h.Op == VsockOpRST && h.SrcPort == 5005 && h.DstPort == 40002
	})

	// The open connection survives the withdrawal; a reset (a restore or
	// a fork) drops it.
	g.send(VsockHeader{SrcPort: 40000, DstPort: 5005, Op: VsockOpRW}, []byte("!"))
	if _, err := io.ReadFull(hc, got[:1]); err != nil || got[0] != '!' {
		t.Fatalf("host read %q, %v", got[:1], err)
	}
	if err := dev.ResetTransport(d.tr); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.Read(got); err == nil {
		t.Fatal("the host connection survived the transport reset")
	}
	if d.failed() {
		t.Fatal(d.tr.Err())
	}
}

// TestVsockGuestConnCap: at most MaxVsockGuestConns guest connections
// are open at once; the next request gets RST, and one more is taken
// once a connection closed.
func TestVsockGuestConnCap(t *testing.T) {
	dev := &Vsock{GuestCID: 3}
	d := newTestDriver(t, dev, 8<<20)
	g := &guestVsock{d: d, dev: dev}
	path, accepted := hostListener(t)
	dev.Expose(1, dialUnix(path))
	defer dev.Close()
	for i := range MaxVsockGuestConns + 1 {
		g.send(VsockHeader{SrcPort: 50000 + uint32(i), DstPort: 1, Op: VsockOpRequest}, nil)
	}
	over := uint32(50000 + MaxVsockGuestConns)
	responses := map[uint32]bool{}
	rst := false
	g.waitPacket(t, "every answer", func(h VsockHeader) bool {
		switch {
		case h.Op == VsockOpResponse && h.DstPort != over:
			responses[h.DstPort] = true
		case h.Op == VsockOpRST && h.DstPort == over:
			rst = true
		default:
			t.Fatalf("unexpected packet %+v", h)
		}
		return rst && len(responses) == MaxVsockGuestConns
	})
	for range MaxVsockGuestConns {
		select {
		case <-accepted:
		case <-time.After(5 * time.Second):
			t.Fatal("fewer host connections than guest ones")
		}
	}
	select {
	case <-accepted:
		t.Fatal("a host connection past the cap")
	case <-time.After(100 * time.Millisecond):
	}
	// The guest resets one: the next request is taken.
	g.send(VsockHeader{SrcPort: 50000, DstPort: 1, Op: VsockOpRST}, nil)
	g.send(VsockHeader{SrcPort: over, DstPort: 1, Op: VsockOpRequest}, nil)
	g.waitPacket(t, "the response under the cap", func(h VsockHeader) bool {
		if h.Op == VsockOpRST {
			t.Fatalf("reset under the cap: %+v", h)
		}
		return h.Op == VsockOpResponse && h.DstPort == over
	})
	if d.failed() {
		t.Fatal(d.tr.Err())
	}
}

// FuzzVsockGuestStream opens a guest connection to an exposed port (its
// host side echoes) and then feeds the device arbitrary packets, each a
// header and the data its length names, cut from the input: the device
// answers, ignores or fails, never panics or hangs.
func FuzzVsockGuestStream(f *testing.F) {
	pkt := func(op uint16, src, dst uint32, data string) []byte {
		h := VsockHeader{SrcCID: 3, DstCID: VsockHostCID, SrcPort: src, DstPort: dst, Type: VsockTypeStream,
			Op: op, Len: uint32(len(data)), BufAlloc: 1 << 16}
		return append(h.Append(nil), data...)
	}
	f.Add(pkt(VsockOpRW, 40000, 7, "hello"))
	f.Add(append(pkt(VsockOpRW, 40000, 7, "x"), pkt(VsockOpShutdown, 40000, 7, "")...))
	f.Add(append(pkt(VsockOpRequest, 40001, 7, ""), pkt(VsockOpResponse, 40001, 7, "")...))
	f.Add(append(pkt(VsockOpRST, 40000, 7, ""), pkt(VsockOpRW, 40000, 7, "late")...))
	f.Add(pkt(VsockOpCreditRequest, 40000, 7, ""))
	f.Add(pkt(VsockOpRequest, 40000, 8, ""))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 16<<10 {
			return
		}
		dev := &Vsock{GuestCID: 3}
		d := newTestDriver(t, dev, 2<<20)
		dev.Expose(7, func() (net.Conn, error) {
			a, b := net.Pipe()
			go func() { io.Copy(b, b); b.Close() }()
			return a, nil
		})
		defer dev.Close()
		g := &guestVsock{d: d, dev: dev}
		g.send(VsockHeader{SrcPort: 40000, DstPort: 7, Op: VsockOpRequest}, nil)
		g.postRx(4)
		for len(in) >= VsockHeaderSize && !d.failed() {
			n := int(le.Uint32(in[24:]))
			if n > len(in)-VsockHeaderSize {
				n = len(in) - VsockHeaderSize
			}
			d.tr.mu.Lock()
			d.add(1, buf{data: in[:VsockHeaderSize]}, buf{data: in[VsockHeaderSize : VsockHeaderSize+n]})
			d.tr.mu.Unlock()
			d.notify(1)
			in = in[VsockHeaderSize+n:]
			g.recv(t)
			if g.rxOut < 4 {
				g.postRx(4 - g.rxOut)
			}
		}
	})
}
