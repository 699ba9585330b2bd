package chunkstore

import (
	"bytes"
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
