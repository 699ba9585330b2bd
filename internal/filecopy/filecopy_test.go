package filecopy

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// copyOf copies src to a new file beside it and returns the copy's path.
func copyOf(t *testing.T, src string) string {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	to := src + ".copy"
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := Copy(out, in); err != nil {
		t.Fatal(err)
	}
	return to
}

func blocks(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestCopyKeepsHoles: a terabyte file with two written pages copies as
// those pages, its size and its holes, not a terabyte of zeros.
func TestCopyKeepsHoles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 40
	head, mid := bytes.Repeat([]byte("h"), 4096), bytes.Repeat([]byte("m"), 4096)
	if _, err := f.WriteAt(head, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(mid, 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	to := copyOf(t, p)
	st, err := os.Stat(to)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != size {
		t.Fatalf("copy has %d bytes, want %d", st.Size(), int64(size))
	}
	if b := blocks(t, to); b > 1<<20 {
		t.Fatalf("copy of a file holding 8 KiB takes %d bytes of disk", b)
	}
	c, err := os.Open(to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, w := range []struct {
		off  int64
		want []byte
	}{{0, head}, {1 << 30, mid}, {1 << 20, make([]byte, 4096)}, {size - 4096, make([]byte, 4096)}} {
		got := make([]byte, len(w.want))
		if _, err := c.ReadAt(got, w.off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, w.want) {
			t.Fatalf("copy at %d differs from the source", w.off)
		}
	}
}

// TestCopySameBytes: files of random sizes with random data and holes
// (a hole at the start, at the end, none) copy byte for byte.
func TestCopySameBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dir := t.TempDir()
	for i := range 40 {
		p := filepath.Join(dir, "f"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		size := r.Int64N(3 << 20)
		for range r.IntN(4) {
			b := make([]byte, r.IntN(200<<10)+1)
			for j := range b {
				b[j] = byte(r.Uint32())
			}
			if _, err := f.WriteAt(b, r.Int64N(size+1)); err != nil {
				t.Fatal(err)
			}
		}
		if r.IntN(2) == 0 {
			if err := f.Truncate(size); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(copyOf(t, p))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("copy of %s (%d bytes) differs: %d bytes", p, len(want), len(got))
		}
	}
}
