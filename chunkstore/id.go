package chunkstore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// ID names a chunk or node: the SHA-256 of its uncompressed bytes (for a
// node, of its canonical encoding). The zero ID means "a run of zero bytes"
// in a chunk list and is never stored.
type ID [32]byte

// Sum returns the ID of data.
func Sum(data []byte) ID { return ID(sha256.Sum256(data)) }

// String returns the ID in lowercase hex.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero ID.
func (id ID) IsZero() bool { return id == ID{} }

// ParseID parses 64 hex digits.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 64 {
		return id, fmt.Errorf("chunkstore: parse id %q: want 64 hex digits, got %d characters", s, len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return ID{}, fmt.Errorf("chunkstore: parse id %q: %w", s, err)
	}
	return id, nil
}

// Ref is one entry of a chunk list: the chunk's id and its length.
// A Ref with the zero ID stands for Size zero bytes (a hole).
type Ref struct {
	ID   ID
	Size uint32
}

// Errors returned (wrapped) by the store.
var (
	// ErrNotFound means the object or ref does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict means a compare-and-swap on a ref saw another value.
	ErrConflict = errors.New("ref changed concurrently")
	// ErrLocked means another process holds the store's lock.
	ErrLocked = errors.New("store is locked by another process")
	// ErrCorrupt means stored bytes failed a check (checksum, hash, format).
	ErrCorrupt = errors.New("corrupt data")
	// ErrNotStore means a directory holds no store (see IsStore).
	ErrNotStore = errors.New("not a tine store")
)

// isZero reports whether b holds only zero bytes.
func isZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
