package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzTailStart: for any log content (a sandbox prints what it likes) and
// line count, tailStart finds where the last n lines start, as a plain
// split would.
func FuzzTailStart(f *testing.F) {
	for _, s := range []string{"", "a", "a\n", "a\nb", "a\nb\n", "\n\n\n", "x\ny\nz\n", strings.Repeat("line\n", 10000)} {
		f.Add(s, 2)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n <= 0 || n > 1<<20 {
			return
		}
		p := filepath.Join(dir, "log")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		off, got := tailStart(fh, n)
		lines := strings.SplitAfter(s, "\n")
		if lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		want := min(n, len(lines))
		wantOff := len(strings.Join(lines[:len(lines)-want], ""))
		if got != want || off != int64(wantOff) {
			t.Fatalf("tailStart(%q, %d) = %d, %d lines; want %d, %d", s, n, off, got, wantOff, want)
		}
	})
}
