package chunkstore

// View is Get without the copy, for readers that only copy the bytes out:
// the result may be shared with the store's cache and must not be
// modified.
func (s *Store) View(id ID) ([]byte, error) {
	if id.IsZero() {
		return []byte{}, nil
	}
	return s.getShared(id)
}
