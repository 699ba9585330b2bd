package cowfs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestMountReadWriteSnapshot(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	m, base := mountNew(t, f, "main", map[string]string{
		"a.txt":       "hello\n",
		"dir/b.txt":   "bee\n",
		"dir/link":    "->b.txt",
		"empty/":      "",
		"big/big.bin": string(bytes.Repeat([]byte("0123456789abcdef"), 1<<16)),
	})
	mnt := m.Dir()
	got, err := os.ReadFile(filepath.Join(mnt, "a.txt"))
	if err != nil || string(got) != "hello\n" {
		t.Fatalf("read a.txt = %q, %v", got, err)
	}
	if tgt, err := os.Readlink(filepath.Join(mnt, "dir/link")); err != nil || tgt != "b.txt" {
		t.Fatalf("readlink = %q, %v", tgt, err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "dir/c.txt"), []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(filepath.Join(mnt, "big/big.bin"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte("X"), 500000); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	if err := os.Remove(filepath.Join(mnt, "a.txt")); err != nil {
		t.Fatal(err)
	}
	snap, err := f.Snapshot(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	changes, err := f.Diff(ctx, base, snap)
	if err != nil {
		t.Fatal(err)
	}
	var got2 []string
	for _, c := range changes {
		got2 = append(got2, c.Kind.String()+" "+c.Path)
	}
	want := []string{"deleted a.txt", "modified big/big.bin", "added dir/c.txt"}
	if !slices.Equal(got2, want) {
		t.Errorf("diff = %q, want %q", got2, want)
	}
	data, err := os.ReadFile(filepath.Join(mnt, "big/big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if data[500000] != 'X' || len(data) != 16<<16 {
		t.Fatalf("big.bin: byte %q len %d", data[500000], len(data))
	}
}
