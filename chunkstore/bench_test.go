package chunkstore

import (
	"bytes"
	"context"
	"testing"

	"tine/chunkstore/internal/cdc"
)

func BenchmarkCut(b *testing.B) {
	data := randBytes(1, 64<<20)
	p, _ := cdc.NewParams(0, 0, 0)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		for d := data; len(d) > 0; {
			d = d[p.Cut(d):]
		}
	}
}

func BenchmarkSum(b *testing.B) {
	data := randBytes(1, 64<<10)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		Sum(data)
	}
}

func BenchmarkCompressRandom(b *testing.B) {
	s := openT(b, b.TempDir(), nil)
	defer s.Close()
	data := randBytes(1, 64<<10)
	b.SetBytes(int64(len(data)))
	scratch := make([]byte, 0, 80<<10)
	for b.Loop() {
		s.prepare(ID{}, kindBlob, data, scratch)
	}
}

func BenchmarkPutStreamRandom(b *testing.B) {
	data := randBytes(1, 256<<20)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		s := openT(b, b.TempDir(), nil)
		if _, err := s.PutStream(context.Background(), bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}
