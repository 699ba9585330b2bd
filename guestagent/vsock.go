package guestagent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ListenVsock listens on AF_VSOCK port port for connections from the
// host (any CID), for the vm runtime, where the host reaches the agent
// through the VMM's vsock device. Serve takes the listener as it takes a
// Unix one.
func ListenVsock(port uint32) (net.Listener, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("guestagent: vsock socket (is the vsock transport loaded?): %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestagent: bind vsock port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 64); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestagent: listen on vsock port %d: %w", port, err)
	}
	return &vsockListener{f: os.NewFile(uintptr(fd), "vsock"), port: port}, nil
}

type vsockListener struct {
	f    *os.File
	port uint32
}

// VsockAddr is a vsock address.
type VsockAddr struct{ CID, Port uint32 }

// Network implements net.Addr.
func (a VsockAddr) Network() string { return "vsock" }

// String implements net.Addr.
func (a VsockAddr) String() string { return fmt.Sprintf("vsock:%d:%d", a.CID, a.Port) }

// Accept waits for the next connection; the runtime's poller waits, so
// Close wakes it.
func (l *vsockListener) Accept() (net.Conn, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var sa unix.Sockaddr
	var aerr error
	err = rc.Read(func(fd uintptr) bool {
		nfd, sa, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		return !errors.Is(aerr, unix.EAGAIN)
	})
	if err != nil {
		return nil, err
	}
	if aerr != nil {
		return nil, fmt.Errorf("guestagent: accept on vsock port %d: %w", l.port, aerr)
	}
	remote := VsockAddr{}
	if vm, ok := sa.(*unix.SockaddrVM); ok {
		remote = VsockAddr{vm.CID, vm.Port}
	}
	return &vsockConn{File: os.NewFile(uintptr(nfd), "vsock-conn"), local: VsockAddr{unix.VMADDR_CID_ANY, l.port}, remote: remote}, nil
}

func (l *vsockListener) Close() error   { return l.f.Close() }
func (l *vsockListener) Addr() net.Addr { return VsockAddr{unix.VMADDR_CID_ANY, l.port} }

// vsockConn is a connected vsock stream; os.File gives it the poller
// and deadlines.
type vsockConn struct {
	*os.File
	local, remote VsockAddr
}

func (c *vsockConn) LocalAddr() net.Addr                { return c.local }
func (c *vsockConn) RemoteAddr() net.Addr               { return c.remote }
func (c *vsockConn) SetDeadline(t time.Time) error      { return c.File.SetDeadline(t) }
func (c *vsockConn) SetReadDeadline(t time.Time) error  { return c.File.SetReadDeadline(t) }
func (c *vsockConn) SetWriteDeadline(t time.Time) error { return c.File.SetWriteDeadline(t) }
