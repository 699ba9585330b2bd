package cowfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkFsync measures a 4 KiB write plus fsync (a commit of the branch).
func BenchmarkFsync(b *testing.B) {
	needFUSE(b)
	f := openTestFS(b)
	m, _ := mountNew(b, f, "main", map[string]string{"a": "a"})
	fh, err := os.Create(filepath.Join(m.Dir(), "log"))
	if err != nil {
		b.Fatal(err)
	}
	defer fh.Close()
	buf := make([]byte, 4096)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := fh.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := fh.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshot measures a snapshot after touching one file in a tree
// of 1000 files.
func BenchmarkSnapshot(b *testing.B) {
	needFUSE(b)
	ctx := context.Background()
	f := openTestFS(b)
	files := map[string]string{}
	for i := 0; i < 1000; i++ {
		files[fmt.Sprintf("d%d/f%d", i%10, i)] = fmt.Sprint(i)
	}
	m, _ := mountNew(b, f, "main", files)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := os.WriteFile(filepath.Join(m.Dir(), "d3/f3"), []byte(fmt.Sprint(i)), 0o644); err != nil {
			b.Fatal(err)
		}
		if _, err := f.Snapshot(ctx, "main"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead measures reading an unchanged 64 MiB file, with and without
// passthrough (after the first open materialised the cache file).
func BenchmarkRead(b *testing.B) {
	needFUSE(b)
	for _, noPT := range []bool{false, true} {
		b.Run(fmt.Sprintf("passthrough=%v", !noPT), func(b *testing.B) {
			ctx := context.Background()
			f := openTestFS(b)
			src := b.TempDir()
			os.WriteFile(filepath.Join(src, "big"), pattern(3, 64<<20), 0o644)
			snap, err := f.Import(ctx, src, "")
			if err != nil {
				b.Fatal(err)
			}
			f.Branch(ctx, snap, "main")
			m, err := f.Mount(ctx, "main", b.TempDir(), &MountOptions{NoPassthrough: noPT})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Unmount()
			p := filepath.Join(m.Dir(), "big")
			os.ReadFile(p)
			b.SetBytes(64 << 20)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := os.ReadFile(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBranch measures forking a branch from a snapshot (O(1): refs
// and a settings file).
func BenchmarkBranch(b *testing.B) {
	ctx := context.Background()
	f := openTestFS(b)
	src := b.TempDir()
	os.WriteFile(filepath.Join(src, "a"), []byte("a"), 0o644)
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := f.Branch(ctx, snap, fmt.Sprintf("b%d", i)); err != nil {
			b.Fatal(err)
		}
	}
}
