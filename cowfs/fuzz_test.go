package cowfs

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
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
	l, p := encodeFileLeaf([]fileRef{{ID: id1, Size: 10}, {Size: 1 << 40}, {ID: id1, Size: 10}})
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

// fuzzBytes hands out fuzz input as fields; past its end it gives zeros.
type fuzzBytes []byte

func (f *fuzzBytes) next() byte {
	if len(*f) == 0 {
		return 0
	}
	b := (*f)[0]
	*f = (*f)[1:]
	return b
}

func (f *fuzzBytes) u64() uint64 {
	var v uint64
	for range 8 {
		v = v<<8 | uint64(f.next())
	}
	return v
}

// str makes a string of a length the input picks (up to 5,119 bytes, so
// that the limits are reached) repeating a few input bytes.
func (f *fuzzBytes) str() string {
	n := int(f.next())
	if n >= 200 {
		n = (n-200)*90 + 200 // 200..5,330
	}
	pat := []byte{f.next(), f.next(), f.next()}
	out := make([]byte, n)
	for i := range out {
		out[i] = pat[i%3]
	}
	return string(out)
}

// FuzzEncodeDir builds directory entries from fuzz input, as a sandbox
// could make them (names, types, modes, sizes, targets, links, xattrs):
// the encoder must refuse them, or the decoder must give them back.
func FuzzEncodeDir(f *testing.F) {
	f.Add([]byte{2, 1, 'a', 'b', 'c', 1, 0xa4, 1, 0, 0, 5, 3, 'x', 'y', 'z', 1})
	f.Add([]byte{1, 250, 'n', 'n', 'n', 3, 0xff, 0xff, 0, 10, 'd', 'd', 'd', 0, 0, 200})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := fuzzBytes(b)
		n := int(in.next() % 8)
		var es []Entry
		for i := 0; i < n; i++ {
			e := Entry{Name: in.str(), Type: EntryType(in.next() % 9), Mode: uint32(in.u64()) & 07777,
				UID: uint32(in.u64()), GID: uint32(in.u64()), MtimeNs: int64(in.u64()), Size: int64(in.u64() >> (in.next() % 64)),
				Target: in.str(), Rdev: in.u64(), LinkID: in.u64(), Nlink: uint32(in.u64())}
			if in.next()%2 == 1 || e.Type == TypeDir {
				e.ID = chunkstore.Sum([]byte{byte(i)})
			}
			for nx := int(in.next()) * int(in.next()); nx > 0; nx-- {
				e.Xattrs = append(e.Xattrs, Xattr{Name: in.str(), Value: []byte(in.str())})
			}
			es = append(es, e)
		}
		want := slices.Clone(es)
		links, payload, err := encodeDir(es)
		if err != nil {
			return // refused at write time
		}
		got, err := decodeDir(links, payload)
		if err != nil {
			t.Fatalf("encoded entries do not decode: %v", err)
		}
		slices.SortFunc(want, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
		if len(got) != len(want) {
			t.Fatalf("%d entries back, want %d", len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.Name != w.Name || g.Type != w.Type || g.Mode != w.Mode || g.UID != w.UID || g.GID != w.GID ||
				g.MtimeNs != w.MtimeNs || g.Size != w.Size || g.ID != w.ID || g.Target != w.Target ||
				g.Rdev != w.Rdev || g.LinkID != w.LinkID || g.Nlink != w.Nlink || !sameMeta(&g, &w) {
				t.Fatalf("entry %q changed in the round trip", w.Name)
			}
		}
	})
}

// FuzzDecodeMeta feeds damaged branch meta objects to the decoder: it must
// return an error or settings that are in range and survive a round trip.
func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte(`{"quota_bytes":1048576,"used_bytes":4096}`))
	f.Add([]byte(`{"used_bytes":-1}`))
	f.Add([]byte(`{"used_bytes":9223372036854775808}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m branchMeta
		if err := decodeMeta(b, &m); err != nil {
			return
		}
		if m.QuotaBytes < 0 || m.UsedBytes < 0 {
			t.Fatalf("decoded a negative count: %+v", m)
		}
		enc, _ := json.Marshal(m)
		var m2 branchMeta
		if err := decodeMeta(enc, &m2); err != nil || m2 != m {
			t.Fatalf("round trip: %+v -> %+v (%v)", m, m2, err)
		}
	})
}
