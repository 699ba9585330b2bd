package guestagent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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
}

// ApplyHygiene reseeds the kernel RNG (RNDADDENTROPY, then
// RNDRESEEDCRNG so the CRNG uses it at once), sets the wall clock, and writes
// the generation counter under root (GenerationFile, relative to root).
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
