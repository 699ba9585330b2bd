package chunkstore

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
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
	f.Fuzz(func(t *testing.T, b []byte) {
		var end int64 = packHeaderLen
		err := scanPack("f.pack", b, func(off int64, h recHeader, stored []byte) {
			if off != end || len(stored) != int(h.clen) {
				t.Fatalf("record at %d (expected %d) with %d bytes for clen %d", off, end, len(stored), h.clen)
			}
			end = off + recHeaderLen + int64(h.clen)
		})
		if err == nil && end != int64(len(b)) {
			t.Fatalf("scan ended at %d of %d without error", end, len(b))
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
	one := appendRefRecord(encodeRefLogHeader(salt), salt, []refOp{{name: "snapshots/a", id: a}})
	two := appendRefRecord(bytes.Clone(one), salt, []refOp{{name: "snapshots/a"}, {name: "branches/main", id: b}})
	obj := appendRecord(nil, kindBlob, codecRaw, 3, Sum([]byte("abc")), []byte("abc"))
	journal := appendRefRecord(bytes.Clone(one), salt, []refOp{{id: Sum([]byte("abc")), pack: 4, off: 16, raw: obj}, {name: "head", id: b}})
	f.Add(encodeRefLogHeader(0))
	f.Add(journal)
	f.Add(one)
	f.Add(two)
	f.Add(two[:len(two)-3])               // torn tail
	f.Add(append(bytes.Clone(two), 0, 0)) // torn header
	bad := bytes.Clone(two)
	bad[refLogHeaderLen+refRecHeaderLen+2] ^= 1 // damaged first record, valid second
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, good, err := decodeRefLog("f.log", b)
		if good < 0 || good > int64(len(b)) || (err == nil && len(b) >= refLogHeaderLen && good < refLogHeaderLen) {
			t.Fatalf("valid prefix %d of %d bytes (err %v)", good, len(b), err)
		}
		if good < refLogHeaderLen {
			if len(recs) != 0 {
				t.Fatalf("records without a header")
			}
			return
		}
		// The valid prefix must encode back to the same bytes.
		again := encodeRefLogHeader(logSalt(b))
		for _, ops := range recs {
			again = appendRefRecord(again, logSalt(b), ops)
		}
		if !bytes.Equal(again, b[:good]) {
			t.Fatalf("ref log round trip differs")
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
