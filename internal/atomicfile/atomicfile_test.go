package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	if err := WriteFile(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("second"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "second" {
		t.Fatalf("read back %q, %v", b, err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("%d entries left in the directory, want only the file", len(ents))
	}
}

func TestWriteFileFailureLeavesOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory in the way of the rename: the write fails, the
	// temporary file goes, and nothing else changes.
	sub := filepath.Join(dir, "d")
	os.Mkdir(sub, 0o700)
	os.WriteFile(filepath.Join(sub, "x"), nil, 0o600)
	if err := WriteFile(sub, []byte("new"), 0o600); err == nil {
		t.Fatal("a write over a non-empty directory succeeded")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("entries after a failed write: %v", ents)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("other file changed: %q", b)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), nil, 0o600); err == nil {
		t.Error("a write into a missing directory succeeded")
	}
}
