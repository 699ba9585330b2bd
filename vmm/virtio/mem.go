package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrBadGuest is wrapped by every error a guest's own data causes.
var ErrBadGuest = errors.New("virtio: bad guest data")

// Memory is guest RAM: guest-physical address a is Memory[a].
type Memory []byte

// Slice returns guest RAM addr..addr+n-1, or an error when any of it lies
// outside RAM (or the range wraps).
func (m Memory) Slice(addr, n uint64) ([]byte, error) {
	end := addr + n
	if end < addr || end > uint64(len(m)) {
		return nil, fmt.Errorf("%w: guest range %#x+%#x outside RAM (%#x bytes)", ErrBadGuest, addr, n, len(m))
	}
	return m[addr:end:end], nil
}

var le = binary.LittleEndian
