// Package fuzzbytes takes a fuzz input apart into the values a fuzz target
// needs, one after another from its front; past the end every value reads
// as zero.
package fuzzbytes

// Reader reads values from the front of a fuzz input.
type Reader struct{ b []byte }

// New returns a Reader of b.
func New(b []byte) *Reader { return &Reader{b: b} }

// Len is how many bytes are left.
func (r *Reader) Len() int { return len(r.b) }

// Byte reads one byte.
func (r *Reader) Byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// U16 reads two bytes, little-endian.
func (r *Reader) U16() uint16 { return uint16(r.Byte()) | uint16(r.Byte())<<8 }

// Take reads up to n bytes (fewer at the end); appending to them never
// writes over the rest of the input.
func (r *Reader) Take(n int) []byte {
	n = max(min(n, len(r.b)), 0)
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}
