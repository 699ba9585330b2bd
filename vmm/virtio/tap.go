package virtio

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenTap creates the TAP interface name (IFF_TAP|IFF_NO_PI: one
// Ethernet frame per read and write, no extra header) and returns its
// file, non-blocking under Go's poller so that Close ends a blocked Read.
// The interface is not persistent: it goes away when the file is closed.
func OpenTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun for TAP %s (load the tun module): %w", name, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TAP %s: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create TAP %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}
