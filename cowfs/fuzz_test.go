package cowfs

import (
	"bytes"
	"slices"
	"testing"

	"tine/chunkstore"
)

// splitNode turns fuzz bytes into (links, payload): the first byte says
// how many 32-byte links follow.
func splitNode(b []byte) ([]chunkstore.ID, []byte) {
	if len(b) == 0 {
		return nil, nil
	}
	n := int(b[0] % 8)
	b = b[1:]
	var links []chunkstore.ID
	for i := 0; i < n && len(b) >= 32; i++ {
		var id chunkstore.ID
		copy(id[:], b[:32])
		links = append(links, id)
		b = b[32:]
	}
	return links, b
}

func joinNode(links []chunkstore.ID, payload []byte) []byte {
	out := []byte{byte(len(links))}
	for _, l := range links {
		out = append(out, l[:]...)
	}
	return append(out, payload...)
}

func seedDirs() [][]byte {
	id1, id2 := chunkstore.Sum([]byte("a")), chunkstore.Sum([]byte("b"))
	var out [][]byte
	for _, es := range [][]Entry{
		nil,
		{{Name: "f", Type: TypeFile, Mode: 0o644, Size: 1, ID: id1, MtimeNs: 1e18}},
		{{Name: "d", Type: TypeDir, Mode: 0o755, ID: id2}, {Name: "l", Type: TypeSymlink, Target: "d", Mode: 0o777},
			{Name: "n\nl", Type: TypeFile, LinkID: 7, Nlink: 2, Xattrs: []Xattr{{"user.a", []byte("v")}, {"user.b", nil}}}},
		{{Name: "c", Type: TypeChar, Rdev: 0x0501}, {Name: "p", Type: TypeFifo, UID: 1000, GID: 1000}},
	} {
		l, p, err := encodeDir(es)
		if err != nil {
			panic(err)
		}
		out = append(out, joinNode(l, p))
	}
	return out
}

// FuzzDecodeDir feeds damaged directory objects to the decoder: it must
// return an error or entries that encode back to the same bytes.
func FuzzDecodeDir(f *testing.F) {
	for _, s := range seedDirs() {
		f.Add(s)
	}
	f.Add([]byte{0, 't', 'c', 'D', '1', 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		links, payload := splitNode(b)
		es, err := decodeDir(links, payload)
		if err != nil {
			return
		}
		l2, p2, err := encodeDir(es)
		if err != nil {
			t.Fatalf("decoded entries do not encode: %v", err)
		}
		if !bytes.Equal(p2, payload) || !slices.Equal(l2, links) {
			t.Fatalf("round trip changed the object")
		}
	})
}

// FuzzDecodeFile feeds damaged file objects (leaf and index forms) to the
// decoder: it must return an error or a header whose parts add up.
func FuzzDecodeFile(f *testing.F) {
	id1 := chunkstore.Sum([]byte("a"))
	l, p := encodeFileLeaf([]chunkstore.Ref{{ID: id1, Size: 10}, {Size: 1 << 20}, {ID: id1, Size: 10}})
	f.Add(joinNode(l, p))
	l, p = encodeFileIndex([]fileLeaf{{id: id1, bytes: 100, nrefs: 3}, {id: id1, bytes: 5, nrefs: 1}})
	f.Add(joinNode(l, p))
	f.Add([]byte{0, 't', 'c', 'F', '1', 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		links, payload := splitNode(b)
		h, err := decodeFile(links, payload)
		if err != nil {
			return
		}
		var sum int64
		if h.index {
			for _, lf := range h.leaves {
				sum += lf.bytes
			}
			l2, p2 := encodeFileIndex(h.leaves)
			if !bytes.Equal(p2, payload) || !slices.Equal(l2, links) {
				t.Fatalf("index round trip changed the object")
			}
		} else {
			for _, r := range h.refs {
				sum += int64(r.Size)
			}
			l2, p2 := encodeFileLeaf(h.refs)
			if !bytes.Equal(p2, payload) || !slices.Equal(l2, links) {
				t.Fatalf("leaf round trip changed the object")
			}
		}
		if sum != h.size {
			t.Fatalf("parts sum to %d, header says %d", sum, h.size)
		}
	})
}
