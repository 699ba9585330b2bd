// Package cdc cuts byte streams into content-defined chunks with FastCDC
// (gear hashing with normalized chunking, level 2).
//
// Boundaries depend only on the bytes and the parameters, never on the
// machine or the run: the gear table is generated from a fixed seed by a
// fixed generator (SplitMix64) that this package implements itself.
package cdc

import (
	"fmt"
	"math/bits"
)

// Default chunk sizes for file data.
const (
	DefaultMin = 16 << 10
	DefaultAvg = 64 << 10
	DefaultMax = 256 << 10
)

// gearSeed seeds the gear table. Changing it changes every boundary.
const gearSeed = 0x74696e65_63646331 // "tinecdc1"

// Params are validated chunking parameters.
type Params struct {
	Min, Avg, Max int
	maskS, maskL  uint64
}

// NewParams validates min/avg/max (zero means the default) and derives the
// normalized masks. Avg is rounded down to a power of two.
func NewParams(min, avg, max int) (Params, error) {
	if min == 0 {
		min = DefaultMin
	}
	if avg == 0 {
		avg = DefaultAvg
	}
	if max == 0 {
		max = DefaultMax
	}
	if min < 64 || !(min <= avg && avg <= max) || max > 1<<30 {
		return Params{}, fmt.Errorf("cdc: bad chunk sizes min=%d avg=%d max=%d (want 64 <= min <= avg <= max <= 1GiB)", min, avg, max)
	}
	b := bits.Len(uint(avg)) - 1 // log2(avg), rounded down
	if b < 8 {
		return Params{}, fmt.Errorf("cdc: average chunk size %d below 256", avg)
	}
	return Params{Min: min, Avg: 1 << b, Max: max, maskS: topMask(b + 2), maskL: topMask(b - 2)}, nil
}

// topMask has the n highest bits set. The gear hash shifts left, so its high
// bits depend on the last 64 bytes: the window of the rolling hash.
func topMask(n int) uint64 { return ^uint64(0) << (64 - n) }

// gear is the table of 256 pseudo-random 64-bit values.
var gear = func() (t [256]uint64) {
	s := SplitMix64(gearSeed)
	for i := range t {
		t[i] = s.Next()
	}
	return t
}()

// Cut returns the length of the first chunk of data. If data is shorter
// than Max and holds no boundary, Cut returns len(data): the caller decides
// whether more data may follow (then it must read more first) or this is
// the end of the stream.
func (p *Params) Cut(data []byte) int {
	n := len(data)
	if n <= p.Min {
		return n
	}
	if n > p.Max {
		n = p.Max
	}
	normal := p.Avg
	if normal > n {
		normal = n
	}
	var h uint64
	i := p.Min
	for ; i < normal; i++ {
		h = h<<1 + gear[data[i]]
		if h&p.maskS == 0 {
			return i + 1
		}
	}
	for ; i < n; i++ {
		h = h<<1 + gear[data[i]]
		if h&p.maskL == 0 {
			return i + 1
		}
	}
	return n
}

// SplitMix64 is a tiny deterministic generator, fixed here so that the gear
// table and test vectors never depend on a library's choices.
type SplitMix64 uint64

// Next returns the next 64-bit value.
func (s *SplitMix64) Next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Fill fills b with the generator's stream, 8 bytes little-endian at a time.
func (s *SplitMix64) Fill(b []byte) {
	for len(b) >= 8 {
		v := s.Next()
		b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[4], b[5], b[6], b[7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
		b = b[8:]
	}
	if len(b) > 0 {
		v := s.Next()
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
	}
}
