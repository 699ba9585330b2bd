package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/chunkstore/internal/cdc"
)

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	g := cdc.SplitMix64(seed)
	g.Fill(b)
	return b
}

func openT(t testing.TB, dir string, o *Options) *Store {
	t.Helper()
	s, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return s
}

func TestPutGet(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	defer s.Close()
	cases := []struct {
		name string
		data []byte
		zero bool
	}{
		{"empty", nil, true},
		{"zeros", make([]byte, 4096), true},
		{"one byte", []byte{7}, false},
		{"text", bytes.Repeat([]byte("hello tine "), 1000), false},
		{"random", randBytes(1, 100000), false},
		{"mostly zero", append(make([]byte, 5000), 1), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, err := s.Put(c.data)
			if err != nil {
				t.Fatal(err)
			}
			if id.IsZero() != c.zero {
				t.Fatalf("Put returned zero=%v, want %v", id.IsZero(), c.zero)
			}
			if !c.zero && id != Sum(c.data) {
				t.Fatalf("id %s != Sum", id)
			}
			if !s.Has(id) {
				t.Fatal("Has = false after Put")
			}
			got, err := s.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if !c.zero && !bytes.Equal(got, c.data) {
				t.Fatal("Get returned other bytes")
			}
			id2, err := s.Put(c.data)
			if err != nil || id2 != id {
				t.Fatalf("second Put = %s, %v", id2, err)
			}
		})
	}
	st := s.Stats()
	if st.Chunks != 4 {
		t.Errorf("Stats.Chunks = %d, want 4 (zeros and duplicates not stored)", st.Chunks)
	}
	if _, err := s.Get(Sum([]byte("absent"))); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(absent) error = %v, want ErrNotFound", err)
	}
	if s.Has(Sum([]byte("absent"))) {
		t.Error("Has(absent) = true")
	}
}

func TestGetReturnsPrivateCopy(t *testing.T) {
	s := openT(t, t.TempDir(), nil)
	defer s.Close()
	data := randBytes(2, 1000)
	id, _ := s.Put(data)
	a, _ := s.Get(id)
	a[0] ^= 0xff
	b, err := s.Get(id)
	if err != nil || !bytes.Equal(b, data) {
		t.Fatalf("Get after modifying an earlier result: %v", err)
	}
}

func TestStreamRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), &Options{PackSize: 1 << 20})
	defer s.Close()
	withHole := randBytes(3, 3<<20)
	clear(withHole[1<<20 : 2<<20+12345])
	cases := []struct {
		name  string
		data  []byte
		fixed int
	}{
		{"empty", nil, 0},
		{"small", []byte("abc"), 0},
		{"random 3MiB", randBytes(4, 3<<20+17), 0},
		{"with hole", withHole, 0},
		{"text", bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog\n"), 50000), 0},
		{"fixed pages", withHole, 4096},
		{"fixed odd", randBytes(5, 10000), 4096},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var refs []Ref
			var err error
			if c.fixed > 0 {
				refs, err = s.PutFixed(ctx, bytes.NewReader(c.data), c.fixed)
			} else {
				refs, err = s.PutStream(ctx, bytes.NewReader(c.data))
			}
			if err != nil {
				t.Fatal(err)
			}
			var total int64
			for i, r := range refs {
				total += int64(r.Size)
				if c.fixed > 0 && i < len(refs)-1 && int(r.Size) != c.fixed {
					t.Fatalf("fixed chunk %d has size %d", i, r.Size)
				}
				if c.fixed == 0 && (r.Size == 0 || int(r.Size) > s.opts.MaxChunk) {
					t.Fatalf("chunk %d has size %d", i, r.Size)
				}
			}
			if total != int64(len(c.data)) {
				t.Fatalf("chunks total %d bytes, want %d", total, len(c.data))
			}
			rd := s.NewReader(refs)
			if rd.Size() != int64(len(c.data)) {
				t.Fatalf("Size = %d", rd.Size())
			}
			got, err := io.ReadAll(rd)
			if err != nil || !bytes.Equal(got, c.data) {
				t.Fatalf("ReadAll: %v, equal=%v", err, bytes.Equal(got, c.data))
			}
			// ReadAt across chunk boundaries, and Seek.
			for _, off := range []int64{0, 1, int64(len(c.data)) / 3, int64(len(c.data)) - 1} {
				if off < 0 || off >= int64(len(c.data)) {
					continue
				}
				p := make([]byte, min(100000, int64(len(c.data))-off))
				if n, err := rd.ReadAt(p, off); err != nil || n != len(p) || !bytes.Equal(p, c.data[off:off+int64(n)]) {
					t.Fatalf("ReadAt(%d): n=%d err=%v", off, n, err)
				}
				if _, err := rd.Seek(off, io.SeekStart); err != nil {
					t.Fatal(err)
				}
				q := make([]byte, 10)
				n, _ := io.ReadFull(rd, q)
				if !bytes.Equal(q[:n], c.data[off:off+int64(n)]) {
					t.Fatalf("Read after Seek(%d) differs", off)
				}
			}
		})
	}
}

func TestHolesNotStored(t *testing.T) {
	s := openT(t, t.TempDir(), nil)
	defer s.Close()
	refs, err := s.PutFixed(context.Background(), bytes.NewReader(make([]byte, 1<<20)), 4096)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		if !r.ID.IsZero() {
			t.Fatalf("zero page stored as %s", r.ID)
		}
	}
	if st := s.Stats(); st.Chunks != 0 || st.LogicalBytes != 1<<20 {
		t.Fatalf("stats after zero pages: %+v", st)
	}
}

func TestNodes(t *testing.T) {
	s := openT(t, t.TempDir(), nil)
	defer s.Close()
	a, _ := s.Put([]byte("a"))
	b, _ := s.Put([]byte("b"))
	cases := []struct {
		name    string
		links   []ID
		payload []byte
	}{
		{"empty", nil, nil},
		{"links", []ID{a, b, {}}, []byte("dir")},
		{"payload only", nil, bytes.Repeat([]byte{1, 2, 3}, 10000)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, err := s.PutNode(c.links, c.payload)
			if err != nil {
				t.Fatal(err)
			}
			links, payload, err := s.GetNode(id)
			if err != nil {
				t.Fatal(err)
			}
			if len(links) != len(c.links) || !bytes.Equal(payload, c.payload) {
				t.Fatalf("GetNode = %d links, %d bytes payload", len(links), len(payload))
			}
			for i := range links {
				if links[i] != c.links[i] {
					t.Fatalf("link %d differs", i)
				}
			}
		})
	}
	if _, _, err := s.GetNode(a); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetNode(blob) error = %v, want ErrNotFound", err)
	}
	// A blob with the bytes of a node's encoding does not stop the node
	// from being stored as a node (GC must follow its links).
	enc := encodeNode([]ID{a}, []byte("x"))
	blobID, _ := s.Put(enc)
	nodeID, err := s.PutNode([]ID{a}, []byte("x"))
	if err != nil || nodeID != blobID {
		t.Fatalf("PutNode after same-bytes blob: %s %v", nodeID, err)
	}
	if _, _, err := s.GetNode(nodeID); err != nil {
		t.Fatalf("GetNode after upgrade: %v", err)
	}
}

func TestRefs(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	x, _ := s.Put([]byte("x"))
	y, _ := s.Put([]byte("y"))
	var zero ID
	steps := []struct {
		op       string
		name     string
		old, new ID
		wantErr  error
	}{
		{"set", "snapshots/a", zero, x, nil},
		{"set", "snapshots/a", zero, y, ErrConflict},
		{"set", "snapshots/a", y, x, ErrConflict},
		{"set", "snapshots/a", x, y, nil},
		{"set", "branches/main", zero, x, nil},
		{"set", "snapshots/a/b", zero, x, nil /* checked below: fails */},
		{"delete", "snapshots/a", x, zero, ErrConflict},
		{"delete", "branches/main", x, zero, nil},
		{"delete", "branches/main", x, zero, ErrNotFound},
		{"set", "nope", zero, Sum([]byte("absent")), ErrNotFound},
	}
	for i, st := range steps {
		var err error
		if st.op == "set" {
			err = s.SetRef(st.name, st.old, st.new)
		} else {
			err = s.DeleteRef(st.name, st.old)
		}
		if st.name == "snapshots/a/b" {
			if err == nil {
				t.Fatalf("step %d: ref under an existing ref's name was accepted", i)
			}
			continue
		}
		if (st.wantErr == nil) != (err == nil) || (st.wantErr != nil && !errors.Is(err, st.wantErr)) {
			t.Fatalf("step %d %s %s: error %v, want %v", i, st.op, st.name, err, st.wantErr)
		}
	}
	for _, bad := range []string{"", "a//b", "../x", "a/./b", "a/.hidden", "/a", "a/", "sp ace", string(make([]byte, 256))} {
		if err := s.SetRef(bad, zero, x); err == nil {
			t.Errorf("SetRef(%q) accepted a bad name", bad)
		}
	}
	if got, err := s.GetRef("snapshots/a"); err != nil || got != y {
		t.Fatalf("GetRef = %s, %v", got, err)
	}
	if _, err := s.GetRef("branches/main"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetRef(deleted) error = %v", err)
	}
	s.Close()

	// Refs and objects survive reopening.
	s = openT(t, dir, nil)
	defer s.Close()
	m, _ := s.ListRefs("snap")
	if len(m) != 1 || m["snapshots/a"] != y {
		t.Fatalf("ListRefs after reopen = %v", m)
	}
	if b, err := s.Get(y); err != nil || string(b) != "y" {
		t.Fatalf("Get after reopen: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "refs", "branches")); !os.IsNotExist(err) {
		t.Errorf("empty ref directory left behind: %v", err)
	}
}

func TestLockedInProcess(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	defer s.Close()
	_, err := Open(dir, nil)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open error = %v, want ErrLocked", err)
	}
}

func TestOpenPackReadAndReopen(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{PackSize: 256 << 10})
	var ids []ID
	var datas [][]byte
	for i := range 200 {
		d := randBytes(uint64(100+i), 5000+i)
		id, err := s.Put(d)
		if err != nil {
			t.Fatal(err)
		}
		ids, datas = append(ids, id), append(datas, d)
	}
	check := func(s *Store) {
		for i, id := range ids {
			got, err := s.Get(id)
			if err != nil || !bytes.Equal(got, datas[i]) {
				t.Fatalf("Get %d: %v", i, err)
			}
		}
	}
	check(s) // from the open pack's buffer and sealed packs
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, nil)
	defer s.Close()
	check(s)
	rep, err := s.Verify(context.Background())
	if err != nil || !rep.OK() || rep.Objects != 200 {
		t.Fatalf("Verify: %v %+v", err, rep)
	}
}

// TestManyFlushes: every Flush writes an index file (SetRef journals its
// objects in the ref log instead); they are merged into a whole-store
// index so that their number stays bounded, and everything reads back
// after reopening.
func TestManyFlushes(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	var ids []ID
	for i := range 300 {
		id, err := s.Put(randBytes(uint64(5000+i), 100))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		if err := s.SetRef("r", ID{}, id); err != nil && i == 0 {
			t.Fatal(err)
		}
		old, _ := s.GetRef("r")
		if err := s.SetRef("r", old, id); err != nil {
			t.Fatal(err)
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	idx, _ := filepath.Glob(filepath.Join(dir, "index", "*.idx"))
	if len(idx) > 80 {
		t.Fatalf("%d index files after 300 flushes; want them merged", len(idx))
	}
	s = openT(t, dir, nil)
	defer s.Close()
	for i, id := range ids {
		if b, err := s.Get(id); err != nil || !bytes.Equal(b, randBytes(uint64(5000+i), 100)) {
			t.Fatalf("object %d after reopen: %v", i, err)
		}
	}
	if st := s.Stats(); st.LogicalBytes != 300*100 {
		t.Fatalf("logical bytes %d after merges, want %d", st.LogicalBytes, 300*100)
	}
}

func TestLooksRandom(t *testing.T) {
	text := bytes.Repeat([]byte("func main() { println(\"hello\") }\n"), 200)
	half := randBytes(9, 4096)
	clear(half[2048:])
	cases := []struct {
		name string
		data []byte
		want bool
	}{
		{"random 4K", randBytes(1, 4096), true},
		{"random 2K", randBytes(2, 2048), true},
		{"random 30K", randBytes(3, 30000), true},
		{"text", text[:4096], false},
		{"half zero page", half, false},
		{"zeros", make([]byte, 4096), false},
		{"7-bit random", func() []byte {
			b := randBytes(4, 4096)
			for i := range b {
				b[i] &= 0x7f
			}
			return b
		}(), false},
	}
	for _, c := range cases {
		if got := looksRandom(c.data); got != c.want {
			t.Errorf("%s: looksRandom = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestClosed(t *testing.T) {
	s := openT(t, t.TempDir(), nil)
	id, _ := s.Put([]byte("x"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ops := map[string]func() error{
		"Put":     func() error { _, err := s.Put([]byte("y")); return err },
		"Get":     func() error { _, err := s.Get(id); return err },
		"PutNode": func() error { _, err := s.PutNode(nil, []byte("n")); return err },
		"SetRef":  func() error { return s.SetRef("a", ID{}, id) },
		"Flush":   s.Flush,
		"GC":      func() error { _, err := s.GC(context.Background()); return err },
	}
	for name, op := range ops {
		if err := op(); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Errorf("%s after Close: %v; want an error saying the store is closed", name, err)
		}
	}
}

// TestOpenAfterCrashInCreate: a crash while Open creates a store leaves
// its directories and log but no marker; the next Open finishes the job
// (it used to refuse the directory for good). Other files still refuse it.
func TestOpenAfterCrashInCreate(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"packs", "index"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, refLogName), encodeRefLogHeader(1, refLogStart), 0o644)
	s := openT(t, dir, nil)
	s.Close()
	if ok, err := IsStore(dir); !ok || err != nil {
		t.Fatalf("IsStore after finishing: %v %v", ok, err)
	}
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "notes"), nil, 0o644)
	if _, err := Open(other, nil); err == nil {
		t.Fatal("Open made a store in a directory holding other files")
	}
}
