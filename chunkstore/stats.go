package chunkstore

// Stats describes a store's contents.
type Stats struct {
	// LogicalBytes counts every byte passed to Put, PutStream and PutFixed
	// over the store's life, zeros and duplicates included.
	LogicalBytes int64
	// UniqueBytes is the uncompressed size of the stored chunks.
	UniqueBytes int64
	// StoredBytes is what the stored chunks and nodes take in packs,
	// compressed, record headers included.
	StoredBytes int64
	// NodeBytes is the uncompressed size of the stored nodes.
	NodeBytes int64
	// Chunks and Nodes count stored objects; Packs counts pack files.
	Chunks, Nodes int64
	Packs         int
	// Refs counts named refs.
	Refs int
	// DedupRatio is LogicalBytes / UniqueBytes; CompressionRatio is
	// (UniqueBytes + NodeBytes) / StoredBytes. Zero when undefined.
	DedupRatio, CompressionRatio float64
}

// Stats returns the store's statistics. It walks the in-memory index, so it
// costs time linear in the number of objects.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := Stats{LogicalBytes: int64(s.logicalDurable + s.logicalPending), Packs: len(s.packs), Refs: len(s.refs)}
	for _, l := range s.index {
		st.StoredBytes += recHeaderLen + int64(l.clen)
		if l.kind == kindNode {
			st.Nodes++
			st.NodeBytes += int64(l.ulen)
		} else {
			st.Chunks++
			st.UniqueBytes += int64(l.ulen)
		}
	}
	if st.UniqueBytes > 0 {
		st.DedupRatio = float64(st.LogicalBytes) / float64(st.UniqueBytes)
	}
	if st.StoredBytes > 0 {
		st.CompressionRatio = float64(st.UniqueBytes+st.NodeBytes) / float64(st.StoredBytes)
	}
	return st
}
