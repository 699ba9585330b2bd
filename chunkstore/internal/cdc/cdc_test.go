package cdc

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json")

// goldenStream is the input of the golden vectors: 6 MiB of SplitMix64
// output from seed 42, a 1 MiB run of zeros, then 2 MiB of repeated text.
func goldenStream() []byte {
	b := make([]byte, 6<<20)
	g := SplitMix64(42)
	g.Fill(b)
	b = append(b, make([]byte, 1<<20)...)
	text := []byte("package main\n\nfunc main() {\n\tprintln(\"hello, tine\")\n}\n")
	for len(b) < 9<<20 {
		b = append(b, text...)
		text = append(text, byte('a'+len(b)%26))
	}
	return b[:9<<20]
}

type golden struct {
	Min, Avg, Max int
	Cuts          []int  // chunk lengths in order
	SHA256        string // of the concatenated SHA-256s of the chunks
}

func cutAll(p Params, data []byte) ([]int, string) {
	var cuts []int
	h := sha256.New()
	for len(data) > 0 {
		n := p.Cut(data)
		s := sha256.Sum256(data[:n])
		h.Write(s[:])
		cuts = append(cuts, n)
		data = data[n:]
	}
	return cuts, hex.EncodeToString(h.Sum(nil))
}

// TestGolden checks that boundaries never change across runs and machines.
func TestGolden(t *testing.T) {
	data := goldenStream()
	sizes := [][3]int{{0, 0, 0}, {2 << 10, 8 << 10, 64 << 10}, {256, 1024, 4096}}
	var got []golden
	for _, sz := range sizes {
		p, err := NewParams(sz[0], sz[1], sz[2])
		if err != nil {
			t.Fatal(err)
		}
		cuts, sum := cutAll(p, data)
		got = append(got, golden{Min: p.Min, Avg: p.Avg, Max: p.Max, Cuts: cuts, SHA256: sum})
	}
	path := filepath.Join("testdata", "golden.json")
	if *update {
		var b []byte
		for i, g := range got {
			line, _ := json.Marshal(g)
			b = append(append(b, "[,"[min(i, 1)]), line...)
			b = append(b, '\n')
		}
		b = append(b, "]\n"...)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden vectors: %v (run go test -update once to create them)", err)
	}
	var want []golden
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(want) != len(got) {
		t.Fatalf("%s holds %d vectors, want %d", path, len(want), len(got))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.SHA256 != w.SHA256 || len(g.Cuts) != len(w.Cuts) {
			t.Errorf("sizes %d/%d/%d: %d chunks hash %s, golden %d chunks hash %s", g.Min, g.Avg, g.Max, len(g.Cuts), g.SHA256, len(w.Cuts), w.SHA256)
			continue
		}
		for j := range g.Cuts {
			if g.Cuts[j] != w.Cuts[j] {
				t.Errorf("sizes %d/%d/%d: chunk %d is %d bytes, golden %d", g.Min, g.Avg, g.Max, j, g.Cuts[j], w.Cuts[j])
				break
			}
		}
	}
}

// TestChunkSizes checks size limits and that the average is near the target
// on random data.
func TestChunkSizes(t *testing.T) {
	data := make([]byte, 32<<20)
	g := SplitMix64(7)
	g.Fill(data)
	for _, sz := range [][3]int{{0, 0, 0}, {2 << 10, 8 << 10, 64 << 10}, {4096, 4096, 4096}} {
		p, err := NewParams(sz[0], sz[1], sz[2])
		if err != nil {
			t.Fatal(err)
		}
		cuts, _ := cutAll(p, data)
		for i, c := range cuts[:len(cuts)-1] {
			if c < p.Min || c > p.Max {
				t.Fatalf("%v: chunk %d has %d bytes", sz, i, c)
			}
		}
		avg := len(data) / len(cuts)
		if avg < p.Avg/2 || avg > p.Avg*2 {
			t.Errorf("%v: average chunk %d bytes, target %d", sz, avg, p.Avg)
		}
	}
}

// TestShiftResistance: inserting bytes near the start changes only the
// first chunks; the rest of the boundaries are found again.
func TestShiftResistance(t *testing.T) {
	data := make([]byte, 8<<20)
	g := SplitMix64(9)
	g.Fill(data)
	p, _ := NewParams(0, 0, 0)
	a, _ := cutAll(p, data)
	shifted := append(append(bytes.Clone(data[:1000]), []byte("inserted")...), data[1000:]...)
	b, _ := cutAll(p, shifted)
	ends := func(cuts []int, shift int) map[int]bool {
		m := map[int]bool{}
		off := 0
		for _, c := range cuts {
			off += c
			m[off-shift] = true
		}
		return m
	}
	ea, eb := ends(a, 0), ends(b, 8)
	same := 0
	for e := range ea {
		if eb[e] {
			same++
		}
	}
	if same < len(a)-3 {
		t.Fatalf("only %d of %d boundaries survived an 8-byte insertion", same, len(a))
	}
}

func TestBadParams(t *testing.T) {
	for _, sz := range [][3]int{{10, 100, 1000}, {100, 50, 1000}, {1000, 2000, 1500}, {64, 128, 256}} {
		if _, err := NewParams(sz[0], sz[1], sz[2]); err == nil {
			t.Errorf("NewParams%v accepted", sz)
		}
	}
}
