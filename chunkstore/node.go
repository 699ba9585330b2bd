package chunkstore

import (
	"bytes"
	"fmt"
	"time"
)

// PutNode stores a node: an object that links to other objects (blobs or
// nodes), so that GC keeps them alive. Zero links are allowed and ignored.
// Every other link must name a stored object: PutNode fails with
// ErrNotFound otherwise (for example if a GC removed a chunk the caller
// held for longer than Options.GCGrace; put it again).
func (s *Store) PutNode(links []ID, payload []byte) (ID, error) {
	enc := encodeNode(links, payload)
	if len(enc) > maxObject {
		return ID{}, fmt.Errorf("chunkstore: put node of %d bytes: over the %d byte object limit", len(enc), maxObject)
	}
	id := Sum(enc)
	p := prepared{id: id, kind: kindNode, codec: codecRaw, ulen: uint32(len(enc)), stored: enc}
	s.mu.RLock()
	l, ok := s.index[id]
	s.mu.RUnlock()
	if !ok || l.kind != kindNode {
		p = s.prepare(id, kindNode, enc, nil)
	}
	// Check and touch the links and add the node under one lock, so that
	// no GC sweep can fall between them.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ID{}, fmt.Errorf("chunkstore: put node: store %s is closed", s.dir)
	}
	now := time.Since(s.opened)
	s.touchMu.Lock()
	for _, link := range links {
		if link.IsZero() {
			continue
		}
		if _, ok := s.index[link]; !ok {
			s.touchMu.Unlock()
			return ID{}, fmt.Errorf("chunkstore: put node %s: link %s: object %w in %s", id, link, ErrNotFound, s.dir)
		}
		s.touched[link] = now
	}
	s.touchMu.Unlock()
	if l, ok := s.index[id]; ok && l.kind == kindNode {
		s.touch(id)
		return id, nil
	}
	return id, s.appendLocked(p.kind, p.codec, p.ulen, p.id, p.stored)
}

// GetNode returns the links and payload of node id. It fails with
// ErrNotFound if id is not stored as a node.
func (s *Store) GetNode(id ID) (links []ID, payload []byte, err error) {
	s.mu.RLock()
	l, ok := s.index[id]
	s.mu.RUnlock()
	if !ok || l.kind != kindNode {
		return nil, nil, fmt.Errorf("chunkstore: get node %s from %s: %w", id, s.dir, ErrNotFound)
	}
	b, err := s.Get(id)
	if err != nil {
		return nil, nil, err
	}
	links, payload, err = decodeNode(id, b)
	if err != nil {
		return nil, nil, fmt.Errorf("chunkstore: %s: %w", s.packPath(l.pack), err)
	}
	return links, bytes.Clone(payload), nil
}
