package treegen

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestGenerateDeterministicPrefix(t *testing.T) {
	ctx := context.Background()
	a, b := t.TempDir(), t.TempDir()
	if err := Generate(ctx, a, 150, 7, 2); err != nil {
		t.Fatal(err)
	}
	if err := Generate(ctx, b, 300, 7, 1); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 150; i++ {
		pa, err := os.ReadFile(filepath.Join(a, Path(i)))
		if err != nil {
			t.Fatal(err)
		}
		pb, err := os.ReadFile(filepath.Join(b, Path(i)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(pa, pb) || len(pa) != Size(7, i) {
			t.Fatalf("file %d differs between runs or has the wrong size", i)
		}
	}
	if _, err := os.Stat(filepath.Join(a, Path(150))); !os.IsNotExist(err) {
		t.Fatalf("file 150 exists in a 150-file tree: %v", err)
	}
}

func TestChangedNests(t *testing.T) {
	tests := []struct{ n, small, large int }{
		{100000, 1, 100}, {100000, 100, 10000}, {10000, 10, 1000}, {1000, 1, 100},
	}
	for _, tc := range tests {
		big := map[int]bool{}
		for _, i := range Changed(tc.n, tc.large) {
			if i < 0 || i >= tc.n || big[i] {
				t.Fatalf("Changed(%d, %d): bad or repeated index %d", tc.n, tc.large, i)
			}
			big[i] = true
		}
		if len(big) != tc.large {
			t.Fatalf("Changed(%d, %d) gave %d files", tc.n, tc.large, len(big))
		}
		for _, i := range Changed(tc.n, tc.small) {
			if !big[i] {
				t.Fatalf("Changed(%d, %d) has %d, not in Changed(%d, %d)", tc.n, tc.small, i, tc.n, tc.large)
			}
		}
	}
}

func TestModifyChangesSize(t *testing.T) {
	dir := t.TempDir()
	if err := Generate(context.Background(), dir, 20, 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := Modify(dir, []int{3}, "x"); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, Path(3)))
	if err != nil {
		t.Fatal(err)
	}
	if int(st.Size()) <= Size(1, 3) {
		t.Fatalf("size after Modify %d, want more than %d", st.Size(), Size(1, 3))
	}
}
