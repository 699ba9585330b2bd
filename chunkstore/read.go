package chunkstore

import (
	"bytes"
	"fmt"
	"path/filepath"
)

// Has reports whether the object id is in the store. The zero ID is
// always present.
func (s *Store) Has(id ID) bool {
	if id.IsZero() {
		return true
	}
	_, ok := s.lookup(id)
	return ok
}

// Get returns the bytes of chunk id. It fails with ErrNotFound if the
// store does not hold it and with ErrCorrupt (naming the pack and offset)
// if the stored bytes fail a check. The zero ID has no bytes: Get returns
// an empty slice for it.
func (s *Store) Get(id ID) ([]byte, error) {
	if id.IsZero() {
		return []byte{}, nil
	}
	b, err := s.getShared(id)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(b), nil
}

// read fetches, checks and decodes object id.
func (s *Store) read(id ID) ([]byte, loc, error) {
	s.mu.RLock()
	raw, l, err := s.readRawLocked(id)
	s.mu.RUnlock()
	if err != nil {
		return nil, l, err
	}
	data, err := s.decode(id, l, raw)
	return data, l, err
}

// readRawLocked returns the record (header and stored bytes) of object id.
// The caller holds s.mu (read or write).
func (s *Store) readRawLocked(id ID) ([]byte, loc, error) {
	if s.closed {
		return nil, loc{}, fmt.Errorf("chunkstore: get %s: store %s is closed", id, s.dir)
	}
	l, ok := s.index[id]
	if !ok {
		return nil, l, fmt.Errorf("chunkstore: get %s from %s: %w", id, s.dir, ErrNotFound)
	}
	raw := make([]byte, recHeaderLen+int(l.clen))
	if err := s.readAtLocked(l.pack, l.off, raw); err != nil {
		return nil, l, fmt.Errorf("chunkstore: get %s: %w", id, err)
	}
	return raw, l, nil
}

// readAtLocked fills p from pack n at off: from the open pack's buffer, a
// buffer being written, or the file. The caller holds s.mu.
func (s *Store) readAtLocked(n uint32, off int64, p []byte) error {
	if s.w != nil && n == s.w.num && off >= s.w.base {
		if off+int64(len(p)) > s.w.size() {
			return fmt.Errorf("pack %s offset %d: beyond the end of the pack: %w", s.packPath(n), off, ErrCorrupt)
		}
		copy(p, s.w.buf[off-s.w.base:])
		return nil
	}
	if s.fl.read(n, off, p) {
		return nil
	}
	f := s.packs[n]
	if f == nil {
		return fmt.Errorf("pack %s is missing: %w", s.packPath(n), ErrCorrupt)
	}
	if k, err := f.ReadAt(p, off); err != nil && k < len(p) {
		return fmt.Errorf("read pack %s offset %d: %w (%w)", s.packPath(n), off, err, ErrCorrupt)
	}
	return nil
}

func (s *Store) packPath(n uint32) string { return filepath.Join(s.dir, "packs", packName(n)) }

// decode checks a raw record against its index entry and returns the
// uncompressed, hash-checked bytes.
func (s *Store) decode(id ID, l loc, raw []byte) ([]byte, error) {
	name := s.packPath(l.pack)
	h, stored, err := decodeRecord(name, l.off, raw)
	if err != nil {
		return nil, fmt.Errorf("chunkstore: get %s: %w", id, err)
	}
	if h.id != id || h.kind != l.kind || h.codec != l.codec || h.ulen != l.ulen || h.clen != l.clen {
		return nil, fmt.Errorf("chunkstore: get %s: pack %s offset %d: record header does not match the index: %w", id, name, l.off, ErrCorrupt)
	}
	data := stored
	if h.codec == codecZstd {
		data, err = s.dec.DecodeAll(stored, make([]byte, 0, h.ulen))
		if err != nil {
			return nil, fmt.Errorf("chunkstore: get %s: pack %s offset %d: zstd: %w (%w)", id, name, l.off, err, ErrCorrupt)
		}
	}
	if len(data) != int(h.ulen) {
		return nil, fmt.Errorf("chunkstore: get %s: pack %s offset %d: decoded %d bytes, want %d: %w", id, name, l.off, len(data), h.ulen, ErrCorrupt)
	}
	if Sum(data) != id {
		return nil, fmt.Errorf("chunkstore: get %s: pack %s offset %d: content hash mismatch: %w", id, name, l.off, ErrCorrupt)
	}
	return data, nil
}
