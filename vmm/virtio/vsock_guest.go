package virtio

import "net"

// Connections the guest opens to the host (CID 2). The guest reaches
// only the ports a host component exposed; each connection it asks for
// is bridged to a new host connection made by that port's dial function,
// with the same credit-based flow control as host clients' connections.
// Everything the guest sends is untrusted: at most MaxVsockGuestConns
// are open at once, the dial runs outside the device loop, and what a
// slow host peer has not read yet is bounded by the credit the device
// gave the guest (vsockBufAlloc per connection).

// vkey names a guest's connection: the exposed host port and the guest's
// own port.
type vkey struct{ host, guest uint32 }

// Expose lets the guest connect to host port port: each connection it
// asks for there is answered once dial returned a host connection, and
// carries the stream both ways; a dial error resets the guest's
// connection. dial runs in a goroutine of its own and should bound its
// own time (a Unix socket dial with a timeout). A nil dial withdraws the
// port; connections open on it stay. A request to a port not exposed
// gets RST. Expose may be called at any time, before the machine runs
// too.
func (v *Vsock) Expose(port uint32, dial func() (net.Conn, error)) {
	v.emu.Lock()
	defer v.emu.Unlock()
	if dial == nil {
		delete(v.exposed, port)
		return
	}
	if v.exposed == nil {
		v.exposed = map[uint32]func() (net.Conn, error){}
	}
	v.exposed[port] = dial
}

func (v *Vsock) isExposed(port uint32) bool {
	return v.exposedDial(port) != nil
}

func (v *Vsock) exposedDial(port uint32) func() (net.Conn, error) {
	v.emu.Lock()
	defer v.emu.Unlock()
	return v.exposed[port]
}

// lookup finds the connection a guest packet from guest port guest to
// host port host belongs to.
func (v *Vsock) lookup(host, guest uint32) *vconn {
	if vc := v.gconns[vkey{host, guest}]; vc != nil {
		return vc
	}
	if vc := v.conns[host]; vc != nil && vc.guest == guest {
		return vc
	}
	return nil
}

// forget removes a connection from its table.
func (v *Vsock) forget(vc *vconn) {
	if vc.fromGuest {
		if v.gconns[vkey{vc.host, vc.guest}] == vc {
			delete(v.gconns, vkey{vc.host, vc.guest})
		}
		return
	}
	if v.conns[vc.host] == vc {
		delete(v.conns, vc.host)
	}
}

// acceptGuest takes a guest's request for a new connection: it reports
// false (the caller answers RST) for a port not exposed, a closed
// device or one at MaxVsockGuestConns; otherwise the host side is dialed
// in the background.
func (v *Vsock) acceptGuest(h VsockHeader) bool {
	dial := v.exposedDial(h.DstPort)
	if dial == nil || v.closed || len(v.gconns) >= MaxVsockGuestConns {
		return false
	}
	if v.gconns == nil {
		v.gconns = map[vkey]*vconn{}
	}
	vc := &vconn{v: v, host: h.DstPort, guest: h.SrcPort, fromGuest: true,
		peerAlloc: h.BufAlloc, peerFwd: h.FwdCnt,
		wsig: make(chan struct{}, 1), rsig: make(chan struct{}, 1)}
	v.gconns[vkey{vc.host, vc.guest}] = vc
	go v.dialGuest(v.t, vc, dial)
	return true
}

// dialGuest makes the host side of a guest's connection and answers the
// guest: RESPONSE and the stream, or RST when the dial failed. A
// connection dropped meanwhile (a reset, a fork, the guest's RST) closes
// what the dial returned.
func (v *Vsock) dialGuest(t *Transport, vc *vconn, dial func() (net.Conn, error)) {
	c, err := dial()
	t.mu.Lock()
	defer t.mu.Unlock()
	if vc.gone || v.closed {
		if c != nil {
			c.Close()
		}
		if !vc.gone {
			vc.gone = true
			v.forget(vc)
		}
		return
	}
	if err != nil || c == nil {
		if c != nil {
			c.Close()
		}
		v.drop(vc, true)
	} else {
		vc.c, vc.established = c, true
		v.sendControl(vc, VsockOpResponse, 0)
		go vc.reader()
		go vc.writer()
	}
	if err := v.deliver(); err != nil {
		t.fail(err)
	}
}
