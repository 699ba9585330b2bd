package disk

import (
	"bytes"
	"testing"

	"tine/chunkstore"
)

func openStore(t *testing.T) *chunkstore.Store {
	s, err := chunkstore.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestForkIsolatesWrites: children see the parent's content at the fork
// and none of each other's later writes; a snapshot reopens to the same
// bytes.
func TestForkIsolatesWrites(t *testing.T) {
	s := openStore(t)
	im, err := New(s, 1<<24)
	if err != nil {
		t.Fatal(err)
	}
	before := bytes.Repeat([]byte("before"), 20000)
	if _, err := im.WriteAt(before, 12345); err != nil {
		t.Fatal(err)
	}
	kids, err := im.Fork(2)
	if err != nil {
		t.Fatal(err)
	}
	im.WriteAt([]byte("parent"), 12345)
	kids[0].WriteAt([]byte("kid0!!"), 12345)
	read := func(d *Image) string {
		b := make([]byte, 6)
		if _, err := d.ReadAt(b, 12345); err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if read(im) != "parent" || read(kids[0]) != "kid0!!" || read(kids[1]) != "before" {
		t.Fatalf("after fork: %q %q %q", read(im), read(kids[0]), read(kids[1]))
	}
	got := make([]byte, len(before))
	kids[1].ReadAt(got, 12345)
	if !bytes.Equal(got, before) {
		t.Fatal("child lost the parent's data")
	}
	root, err := kids[0].Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	re, err := Open(s, root)
	if err != nil {
		t.Fatal(err)
	}
	if read(re) != "kid0!!" || re.Size() != 1<<24 {
		t.Fatalf("reopened snapshot reads %q", read(re))
	}
	// Out-of-range access is an error, not a panic.
	if _, err := re.ReadAt(make([]byte, 10), 1<<24-5); err == nil {
		t.Fatal("read past the end accepted")
	}
	if _, err := re.WriteAt(make([]byte, 10), -1); err == nil {
		t.Fatal("write at a negative offset accepted")
	}
}

func TestSpillKeepsContent(t *testing.T) {
	s := openStore(t)
	im, _ := New(s, 1<<22)
	im.maxDirty = 2
	for i := range 10 {
		im.WriteAt([]byte{byte(i + 1)}, int64(i)*ChunkSize+7)
	}
	if len(im.dirty) > 2 {
		t.Fatalf("overlay holds %d chunks, bound 2", len(im.dirty))
	}
	for i := range 10 {
		b := make([]byte, 1)
		im.ReadAt(b, int64(i)*ChunkSize+7)
		if b[0] != byte(i+1) {
			t.Fatalf("chunk %d reads %d", i, b[0])
		}
	}
}

func TestOpenRejectsForeignNodes(t *testing.T) {
	s := openStore(t)
	bad, _ := s.PutNode(nil, []byte("TINEDSK1\x00\x00\x00\x00\x00\x00\x10\x00"))
	if _, err := Open(s, bad); err == nil {
		t.Fatal("root with missing leaves accepted")
	}
	other, _ := s.PutNode(nil, []byte("something else"))
	if _, err := Open(s, other); err == nil {
		t.Fatal("foreign node accepted")
	}
}
