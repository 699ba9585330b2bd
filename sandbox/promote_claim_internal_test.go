package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestClaimPromotion: while a promotion of a sandbox into a directory is
// under way, another of that sandbox (anywhere) or into that directory
// (from any sandbox, by any spelling of its path) is refused with
// ErrPromoting; once it ends, both are free again.
func TestClaimPromotion(t *testing.T) {
	var m Manager
	base := t.TempDir()
	dir, other := filepath.Join(base, "dir"), filepath.Join(base, "other")
	os.Mkdir(dir, 0o755)
	os.Mkdir(other, 0o755)
	link := filepath.Join(base, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	done, err := m.claimPromotion("a", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{{"a", other}, {"b", dir}, {"b", link}} {
		if _, err := m.claimPromotion(c[0], c[1]); !errors.Is(err, ErrPromoting) {
			t.Errorf("promotion of %s into %s while a's into %s runs: %v, want ErrPromoting", c[0], c[1], dir, err)
		}
	}
	done2, err := m.claimPromotion("b", other)
	if err != nil {
		t.Fatalf("an unrelated promotion: %v", err)
	}
	done2()
	done()
	done, err = m.claimPromotion("b", link)
	if err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	done()
}
