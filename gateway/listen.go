package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// A gateway's sockets are bound to its sandbox's host-side veth
// (SO_BINDTODEVICE) and serve only the sandbox's address: a packet that
// reaches the gateway's address through another interface (another
// sandbox's veth, routed by the host) finds no socket, and a connection
// from any other address is closed at once. Which sandbox a connection
// belongs to is fixed by where it came in, never by what it says.

// bindControl binds a socket to dev before it binds its address.
func bindControl(dev string) func(network, address string, rc syscall.RawConn) error {
	return func(network, address string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev)
		})
		if err == nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("bind %s to device %s: %w", address, dev, err)
		}
		return nil
	}
}

// ListenTCP listens on addr bound to device dev and accepts connections
// from peer only; others are closed as they come.
func ListenTCP(ctx context.Context, dev string, addr netip.AddrPort, peer netip.Addr) (net.Listener, error) {
	if dev == "" || !peer.IsValid() {
		return nil, errors.New("gateway: a listener needs its sandbox's device and address")
	}
	lc := net.ListenConfig{Control: bindControl(dev)}
	ln, err := lc.Listen(ctx, "tcp4", addr.String())
	if err != nil {
		return nil, err
	}
	return &peerListener{Listener: ln, peer: peer.Unmap()}, nil
}

// listenUDP listens for datagrams on addr bound to device dev; the reader
// checks the sender (fromPeer).
func listenUDP(ctx context.Context, dev string, addr netip.AddrPort) (net.PacketConn, error) {
	if dev == "" {
		return nil, errors.New("gateway: a listener needs its sandbox's device")
	}
	lc := net.ListenConfig{Control: bindControl(dev)}
	return lc.ListenPacket(ctx, "udp4", addr.String())
}

// peerListener accepts connections from one address only.
type peerListener struct {
	net.Listener
	peer netip.Addr
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if fromPeer(c.RemoteAddr(), l.peer) {
			return c, nil
		}
		c.Close()
	}
}

// fromPeer says whether a is the address peer (at any port).
func fromPeer(a net.Addr, peer netip.Addr) bool {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		return false
	}
	return ap.Addr().Unmap() == peer
}

// Listen listens on port of the link's gateway address, bound to its
// host-side veth and serving the sandbox's address only: for services
// the host offers one sandbox alone.
func (l *Link) Listen(ctx context.Context, port uint16) (net.Listener, error) {
	return ListenTCP(ctx, l.HostName, netip.AddrPortFrom(l.Gateway, port), l.Addr)
}
