package cowfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// openOverlayFDs counts this process's descriptors open on files under dir.
func openOverlayFDs(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, dir+"/") {
			n++
		}
	}
	return n
}

// A branch with many more uncommitted files than maxOpenOverlays keeps
// every file's bytes while holding at most maxOpenOverlays descriptors, so
// an untar of a large tree cannot run the server out of descriptors.
func TestManyUncommittedFiles(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "main", map[string]string{"seed": "x"})
	const files = 3 * maxOpenOverlays
	for i := range files {
		p := filepath.Join(m.Dir(), fmt.Sprintf("f%04d", i))
		if err := os.WriteFile(p, []byte(fmt.Sprintf("content of file %d\n", i)), 0o644); err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
	}
	overlayDir := filepath.Join(f.branchDir("main"), "overlay")
	if n := openOverlayFDs(t, overlayDir); n > maxOpenOverlays {
		t.Errorf("%d overlay files open, want at most %d", n, maxOpenOverlays)
	}
	// Rewrite the first (long closed) files in place, then read all back.
	for i := range 10 {
		p := filepath.Join(m.Dir(), fmt.Sprintf("f%04d", i))
		fh, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fh.WriteAt([]byte("C"), 0); err != nil {
			t.Fatal(err)
		}
		fh.Close()
	}
	check := func(when string) {
		for i := range files {
			b, err := os.ReadFile(filepath.Join(m.Dir(), fmt.Sprintf("f%04d", i)))
			want := fmt.Sprintf("content of file %d\n", i)
			if i < 10 {
				want = "C" + want[1:]
			}
			if err != nil || string(b) != want {
				t.Fatalf("%s: file %d = %q, %v; want %q", when, i, b, err, want)
			}
		}
	}
	check("before snapshot")
	if _, err := f.Snapshot(context.Background(), "main"); err != nil {
		t.Fatal(err)
	}
	if n := openOverlayFDs(t, overlayDir); n != 0 {
		t.Errorf("%d overlay files open after the snapshot committed every file", n)
	}
	check("after snapshot")
}
