package chunkstore

import (
	"bytes"
	"context"
	"strconv"
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
	for _, n := range []int{4 << 10, 64 << 10} {
		b.Run(strconv.Itoa(n), func(b *testing.B) { benchCompressRandom(b, n) })
	}
}

func benchCompressRandom(b *testing.B, n int) {
	s := openT(b, b.TempDir(), nil)
	defer s.Close()
	data := randBytes(1, n)
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

// BenchmarkPutExisting measures Put of a chunk already stored: a hash and
// a map look-up.
func BenchmarkPutExisting(b *testing.B) {
	s := openT(b, b.TempDir(), nil)
	defer s.Close()
	data := randBytes(1, 4096)
	s.Put(data)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := s.Put(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHas measures Has of a stored id.
func BenchmarkHas(b *testing.B) {
	s := openT(b, b.TempDir(), nil)
	defer s.Close()
	id, _ := s.Put(randBytes(1, 4096))
	for b.Loop() {
		if !s.Has(id) {
			b.Fatal("missing")
		}
	}
}

// BenchmarkPutFixedPages stores 64 MiB of half-compressible pages, a
// quarter of them zero, as a VM memory image would be.
func BenchmarkPutFixedPages(b *testing.B) {
	for _, level := range []int{-1, 1, 2} {
		b.Run("level"+string(rune('0'+level+1)), func(b *testing.B) { benchPages(b, level) })
	}
}

func benchPages(b *testing.B, level int) {
	data := randBytes(2, 64<<20)
	for p := 0; p < len(data)/4096; p++ {
		page := data[p*4096 : (p+1)*4096]
		switch p % 4 {
		case 0:
			clear(page)
		case 1:
			clear(page[2048:])
		}
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		s := openT(b, b.TempDir(), &Options{Level: level})
		if _, err := s.PutFixed(context.Background(), bytes.NewReader(data), 4096); err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}

// BenchmarkGetSealed measures Get of 4 KiB chunks from a sealed pack with
// the cache off: one pread, a CRC, a SHA-256.
func BenchmarkGetSealed(b *testing.B) {
	dir := b.TempDir()
	s := openT(b, dir, nil)
	var ids []ID
	for i := range 1000 {
		id, _ := s.Put(randBytes(uint64(i), 4096))
		ids = append(ids, id)
	}
	s.Close()
	s = openT(b, dir, &Options{CacheBytes: -1})
	defer s.Close()
	b.SetBytes(4096)
	i := 0
	for b.Loop() {
		if _, err := s.Get(ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkLooksRandom(b *testing.B) {
	data := randBytes(1, 4096)
	b.SetBytes(4096)
	for b.Loop() {
		looksRandom(data)
	}
}
