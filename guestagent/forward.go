package guestagent

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ForwardUnix listens on a new Unix socket at path, mode 0666 (any
// process of the guest may connect, as to the ns runtime's bound
// socket), and joins every connection accepted there to a new one from
// dial, in both directions, each direction's end passed on as a half
// close. A connection whose dial fails is closed. It serves until the
// listener is closed.
func ForwardUnix(path string, dial func() (net.Conn, error)) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("guestagent: forward %s: %w", path, err)
	}
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("guestagent: forward %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("guestagent: forward %s: %w", path, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				up, err := dial()
				if err != nil {
					c.Close()
					return
				}
				join(c, up)
			}()
		}
	}()
	return l, nil
}

// join copies a to b and b to a until both directions ended, then
// closes both.
func join(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		io.Copy(b, a)
		closeWrite(b)
		close(done)
	}()
	io.Copy(a, b)
	closeWrite(a)
	<-done
	a.Close()
	b.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		c.Close()
	}
}

// DialVsock connects to port on context id cid over AF_VSOCK (the host
// is unix.VMADDR_CID_HOST); the kernel bounds the connect (2 s by
// default for vsock).
func DialVsock(cid, port uint32) (net.Conn, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("guestagent: vsock socket (is the vsock transport loaded?): %w", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrVM{CID: cid, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestagent: connect to vsock %d:%d: %w", cid, port, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestagent: vsock %d:%d: %w", cid, port, err)
	}
	local := VsockAddr{unix.VMADDR_CID_ANY, 0}
	if sa, err := unix.Getsockname(fd); err == nil {
		if vm, ok := sa.(*unix.SockaddrVM); ok {
			local = VsockAddr{vm.CID, vm.Port}
		}
	}
	return &vsockConn{File: os.NewFile(uintptr(fd), "vsock-conn"), local: local, remote: VsockAddr{cid, port}}, nil
}

// CloseWrite shuts the connection's sending direction: the peer reads
// EOF and can still answer.
func (c *vsockConn) CloseWrite() error {
	rc, err := c.File.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	return serr
}

// ForwardInsideAPI serves the sandbox's inside API in a vm guest:
// path (proto.InsideAPISocket) forwards to host vsock port port, where
// the vm runtime bridges it to the sandbox's API socket on the host.
func ForwardInsideAPI(path string, port uint32) (net.Listener, error) {
	return ForwardUnix(path, func() (net.Conn, error) { return DialVsock(unix.VMADDR_CID_HOST, port) })
}
