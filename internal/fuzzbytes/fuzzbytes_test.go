package fuzzbytes

import (
	"bytes"
	"testing"
)

func TestReader(t *testing.T) {
	r := New([]byte{1, 2, 3, 4, 5})
	if b := r.Byte(); b != 1 {
		t.Fatalf("Byte = %d, want 1", b)
	}
	if v := r.U16(); v != 0x0302 {
		t.Fatalf("U16 = %#x, want 0x0302", v)
	}
	if p := r.Take(5); !bytes.Equal(p, []byte{4, 5}) || r.Len() != 0 {
		t.Fatalf("Take(5) = %v, %d left; want [4 5], 0", p, r.Len())
	}
	if r.Byte() != 0 || r.U16() != 0 || len(r.Take(3)) != 0 || len(r.Take(-1)) != 0 {
		t.Fatal("an empty reader does not read zeros")
	}
}
