package guestagent

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"tine/guestagent/proto"
	"tine/internal/rtnl"
)

// GenerationFile is where the agent publishes the VM's generation: a
// decimal counter that changes on every fork and restore, so programs
// that cache randomness or identity can tell they were cloned.
const GenerationFile = "/run/tine/generation"

// rndAddEntropy is RNDADDENTROPY: _IOW('R', 0x03, int[2]);
// rndReseedCRNG is RNDRESEEDCRNG: _IO('R', 0x07).
const (
	rndAddEntropy = 0x40085203
	rndReseedCRNG = 0x5207
)

// Hygiene is what a clone is told before it runs user work (see
// docs/fork-hygiene.md).
type Hygiene struct {
	// Entropy is host randomness mixed into the kernel pool and credited.
	Entropy []byte
	// Now is the host's wall clock; zero leaves the clock alone.
	Now time.Time
	// Generation is the clone's generation counter.
	Generation uint64
	// Net is the clone's network identity; nil leaves the network alone.
	Net *NetIdentity
	// Share is the project share to (re)mount (MountShare); nil leaves
	// the mounts alone.
	Share *proto.ShareMount
}

// NetIdentity is what ApplyHygiene gives a network interface.
type NetIdentity struct {
	Interface string
	MAC       net.HardwareAddr
	Addr      netip.Prefix
	Gateway   netip.Addr
}

// netWait bounds how long ApplyHygiene waits for the interface to appear
// (its driver may still be probing right after boot).
const netWait = 10 * time.Second

// ApplyNet gives the interface its identity: link down (which also drops
// the neighbours and routes learnt under the old identity), the new MAC,
// the new address as the only IPv4 one, link up, and the default route
// through the gateway.
func ApplyNet(n NetIdentity) error {
	var ifc *net.Interface
	var err error
	for deadline := time.Now().Add(netWait); ; time.Sleep(50 * time.Millisecond) {
		if ifc, err = net.InterfaceByName(n.Interface); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("guestagent: network interface %s: %w", n.Interface, err)
	}
	c, err := rtnl.Dial()
	if err != nil {
		return fmt.Errorf("guestagent: %w", err)
	}
	defer c.Close()
	for _, step := range []func() error{
		func() error { return c.SetUp(ifc.Index, false) },
		func() error { return c.SetMAC(ifc.Index, n.MAC) },
		func() error { return c.ReplaceAddr(ifc.Index, n.Addr) },
		func() error { return c.SetUp(ifc.Index, true) },
		func() error { return c.ReplaceDefaultRoute(ifc.Index, n.Gateway) },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("guestagent: network identity of %s: %w", n.Interface, err)
		}
	}
	return nil
}

// ApplyHygiene reseeds the kernel RNG (RNDADDENTROPY, then
// RNDRESEEDCRNG so the CRNG uses it at once), sets the wall clock, gives
// the network interface its identity (ApplyNet), (re)mounts the project
// share (MountShare), and last writes the
// generation counter under root (GenerationFile, relative to root), so
// that a program that sees the new generation sees the rest done.
func ApplyHygiene(root string, h Hygiene) error {
	if len(h.Entropy) > 0 {
		if err := addEntropy(h.Entropy); err != nil {
			return err
		}
	}
	if !h.Now.IsZero() {
		ts := unix.NsecToTimespec(h.Now.UnixNano())
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("guestagent: set the wall clock: %w", err)
		}
	}
	if h.Net != nil {
		if err := ApplyNet(*h.Net); err != nil {
			return err
		}
	}
	if h.Share != nil {
		if err := MountShare(h.Share.Tag, h.Share.Path); err != nil {
			return err
		}
	}
	p := filepath.Join(root, GenerationFile)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("guestagent: generation counter: %w", err)
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(h.Generation, 10)+"\n"), 0o644); err != nil {
		return fmt.Errorf("guestagent: generation counter: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("guestagent: generation counter: %w", err)
	}
	return nil
}

func addEntropy(b []byte) error {
	if len(b) > 4096 {
		b = b[:4096]
	}
	f, err := os.OpenFile("/dev/random", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("guestagent: open /dev/random: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(b))
	*(*int32)(unsafe.Pointer(&buf[0])) = int32(8 * len(b))
	*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(b))
	copy(buf[8:], b)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		return fmt.Errorf("guestagent: RNDADDENTROPY: %w", errno)
	}
	// Once the kernel's CRNG is initialized, credited entropy waits for
	// the next scheduled reseed; a clone must not wait: reseed now
	// (Linux 5.18+; older kernels reseed on their own schedule).
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndReseedCRNG, 0); errno != 0 && errno != unix.ENOTTY && errno != unix.EINVAL {
		return fmt.Errorf("guestagent: RNDRESEEDCRNG: %w", errno)
	}
	return nil
}
