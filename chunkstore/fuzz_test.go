package chunkstore

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Fuzz targets for every decoder of bytes read from disk. Seeds are real
// encodings (see also testdata/fuzz).

func FuzzDecodeIndex(f *testing.F) {
	id := Sum([]byte("x"))
	f.Add(encodeIndex(nil, 0, true))
	f.Add(encodeIndex([]indexEntry{{id: id, loc: loc{pack: 1, kind: kindBlob, codec: codecZstd, clen: 10, ulen: 100, off: 16}}}, 100, false))
	f.Add(encodeIndex([]indexEntry{{id: id, loc: loc{pack: 2, kind: kindNode, clen: 5, ulen: 5, off: 64}}, {id: Sum(nil), loc: loc{pack: 2, kind: kindBlob, clen: 1, ulen: 1, off: 200}}}, 7, true))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, logical, full, err := decodeIndex("f.idx", b)
		if err != nil {
			return
		}
		// What decodes must encode back to the same bytes.
		if again := encodeIndex(entries, logical, full); !bytes.Equal(again, b) {
			t.Fatalf("index round trip differs")
		}
	})
}

func FuzzScanPack(f *testing.F) {
	p := encodePackHeader(1)
	p = appendRecord(p, kindBlob, codecRaw, 3, Sum([]byte("abc")), []byte("abc"))
	p = appendRecord(p, kindNode, codecRaw, 5, Sum([]byte("\x00node")), []byte("\x00node"))
	f.Add(p)
	f.Add(encodePackHeader(7))
	f.Add(p[:len(p)-1])
	bad := bytes.Clone(p)
	bad[packHeaderLen+5] ^= 1 // first record damaged, second valid
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		var prev int64 = packHeaderLen
		damage, end := scanPack("f.pack", bytes.NewReader(b), int64(len(b)), func(off int64, h recHeader) {
			if off < prev {
				t.Fatalf("record at %d overlaps the one before (ends at %d)", off, prev)
			}
			// What the scan accepts, a read accepts.
			if _, stored, err := decodeRecord("f.pack", off, b[off:]); err != nil || len(stored) != int(h.clen) {
				t.Fatalf("record at %d: %v", off, err)
			}
			prev = off + recHeaderLen + int64(h.clen)
		})
		if end > int64(len(b)) || len(b) >= packHeaderLen && end < prev {
			t.Fatalf("end %d of %d bytes, last record ends at %d", end, len(b), prev)
		}
		for _, d := range damage {
			if d.File != "f.pack" || d.Offset < 0 || d.Offset > int64(len(b)) {
				t.Fatalf("damage %v", d)
			}
		}
	})
}

func FuzzDecodeRef(f *testing.F) {
	f.Add("snapshots/a", encodeRef("snapshots/a", Sum([]byte("a"))))
	f.Add("b", encodeRef("b", Sum([]byte("b"))))
	f.Add("b", []byte("zz\n"))
	f.Fuzz(func(t *testing.T, name string, b []byte) {
		id, err := decodeRef(name, "f", b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeRef(name, id), b) {
			t.Fatalf("ref round trip differs")
		}
	})
}

func FuzzDecodeRefLog(f *testing.F) {
	a, b := Sum([]byte("a")), Sum([]byte("b"))
	const salt = 0x5eed
	table := appendRefFrame(nil, salt, 0, []refOp{{name: "snapshots/a", id: a}})
	one := append(encodeRefLogHeader(salt, int64(refLogStart+len(table))), table...)
	two := appendRefFrame(bytes.Clone(one), salt, 1, []refOp{{name: "snapshots/a"}, {name: "branches/main", id: b}})
	obj := appendRecord(nil, kindBlob, codecRaw, 3, Sum([]byte("abc")), []byte("abc"))
	journal := appendRefFrame(bytes.Clone(one), salt, 1, []refOp{{id: Sum([]byte("abc")), pack: 4, off: 16, raw: obj}, {name: "head", id: b}})
	f.Add(encodeRefLogHeader(0, refLogStart))
	f.Add(journal)
	f.Add(one)
	f.Add(two)
	f.Add(two[:len(two)-3])               // torn copy
	f.Add(two[:len(two)-40])              // torn first copy
	f.Add(append(bytes.Clone(two), 0, 0)) // grown by zeros
	bad := bytes.Clone(two)
	bad[refLogStart+refRecHeaderLen+2] ^= 1 // damaged first record, valid copy
	f.Add(bad)
	f.Add(v2Log(salt, [][]refOp{{{name: "a", id: a}}, {{name: "b", id: b}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := decodeRefLog("f.log", b)
		if r.good < 0 || r.good > int64(max(len(b), refLogStart)) {
			t.Fatalf("valid prefix %d of %d bytes", r.good, len(b))
		}
		for _, d := range r.damage {
			if d.File != "f.log" || d.Offset < 0 || d.Offset > int64(len(b)) || !strings.Contains(d.Problem, "offset") {
				t.Fatalf("damage %v", d)
			}
		}
		if len(r.damage) > 0 || r.fix != nil {
			return
		}
		// An undamaged log's valid prefix must encode back to the same bytes.
		var again []byte
		if r.version == refLogV2 {
			again = v2Log(r.salt, r.recs)
		} else {
			again = encodeRefLogHeader(r.salt, r.base)
			for i, ops := range r.recs {
				again = appendRefFrame(again, r.salt, uint64(i), ops)
			}
		}
		if !bytes.Equal(again, b[:r.good]) {
			t.Fatalf("ref log round trip differs")
		}
	})
}

// v2Log encodes a format 2 ref log holding recs.
func v2Log(salt uint32, recs [][]refOp) []byte {
	b := append([]byte(refLogMagic), 2, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, salt)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	for _, ops := range recs {
		b = appendRefRecord(b, salt, false, 0, ops)
	}
	return b
}

// FuzzDecodeRefLogHeader: a header that decodes encodes back to the same
// bytes.
func FuzzDecodeRefLogHeader(f *testing.F) {
	f.Add(encodeRefLogHeader(7, refLogStart)[:refLogHeaderLen])
	f.Add(encodeRefLogHeader(0xffffffff, 1<<20)[:refLogHeaderLen])
	f.Fuzz(func(t *testing.T, b []byte) {
		salt, base, err := decodeRefLogHeader("f.log", 0, b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeRefLogHeader(salt, base)[:refLogHeaderLen], b[:refLogHeaderLen]) {
			t.Fatalf("header round trip differs")
		}
	})
}

func FuzzDecodeNode(f *testing.F) {
	f.Add(encodeNode(nil, nil))
	f.Add(encodeNode([]ID{Sum([]byte("a")), {}}, []byte("payload")))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		links, payload, err := decodeNode(ID{}, b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeNode(links, payload), b) {
			t.Fatalf("node round trip differs")
		}
	})
}

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the fuzz seed files made from a real store")

// TestFuzzSeeds writes (with -update-seeds) and checks seed corpus files
// taken from a real store: its pack, index, ref log, a ref file of format
// 1 and a node.
func TestFuzzSeeds(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	a, _ := s.Put(bytes.Repeat([]byte("seed "), 100))
	b, _ := s.Put(randBytes(3, 300))
	node, _ := s.PutNode([]ID{a, {}, b}, []byte("dir payload"))
	if err := s.SetRef("snapshots/seed", ID{}, node); err != nil {
		t.Fatal(err)
	}
	s.Close()
	read := func(glob string) []byte {
		m, _ := filepath.Glob(filepath.Join(dir, glob))
		if len(m) != 1 {
			t.Fatalf("%s: %v", glob, m)
		}
		data, err := os.ReadFile(m[0])
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	seeds := map[string]string{
		"FuzzScanPack":     fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", read("packs/*.pack")),
		"FuzzDecodeIndex":  fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", read("index/*.idx")),
		"FuzzDecodeRef":    fmt.Sprintf("go test fuzz v1\nstring(%q)\n[]byte(%q)\n", "snapshots/seed", encodeRef("snapshots/seed", node)),
		"FuzzDecodeRefLog": fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", read(refLogName)),
		"FuzzDecodeNode":   fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", encodeNode([]ID{a, {}, b}, []byte("dir payload"))),
	}
	for target, content := range seeds {
		path := filepath.Join("testdata", "fuzz", target, "real-store")
		if *updateSeeds {
			os.MkdirAll(filepath.Dir(path), 0o755)
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("seed corpus file missing: %v (run go test -run TestFuzzSeeds . -args -update-seeds)", err)
		}
	}
}

// FuzzDecodeStored feeds a record whose checksum and header are right but
// whose stored bytes are anything (a damaged pack, or one written by
// someone else) to the read path, zstd branch included: it must return
// an error or bytes whose hash is the record's id, within the record's
// length, and never panic.
func FuzzDecodeStored(f *testing.F) {
	st, err := Open(f.TempDir(), nil)
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	plain := []byte("hello, hello, hello, hello, hello")
	packed := st.enc.EncodeAll(plain, nil)
	f.Add(uint8(codecZstd), uint32(len(plain)), packed, false)
	f.Add(uint8(codecZstd), uint32(len(plain)), packed, true)
	f.Add(uint8(codecRaw), uint32(len(plain)), plain, false)
	f.Add(uint8(codecZstd), uint32(1<<20), packed[:len(packed)/2], false)
	f.Add(uint8(7), uint32(3), []byte("abc"), false)
	f.Fuzz(func(t *testing.T, codec uint8, ulen uint32, stored []byte, rightID bool) {
		id := Sum([]byte("some other object"))
		if rightID {
			if d, err := st.dec.DecodeAll(stored, nil); err == nil {
				id = Sum(d)
			} else {
				id = Sum(stored)
			}
		}
		raw := appendRecord(nil, kindBlob, codec, ulen, id, stored)
		l := loc{pack: 1, kind: kindBlob, codec: codec, clen: uint32(len(stored)), ulen: ulen, off: packHeaderLen}
		data, err := st.decode(id, l, raw)
		if err != nil {
			return
		}
		if Sum(data) != id || len(data) != int(ulen) {
			t.Fatalf("decoded %d bytes for id %s (ulen %d): not the object", len(data), id, ulen)
		}
	})
}
