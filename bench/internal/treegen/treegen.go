// Package treegen writes deterministic synthetic file trees for
// benchmarks: the same seed and file count always give the same paths and
// bytes, and the tree of n files is a prefix of the tree of m > n files.
package treegen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
)

// Layout of the tree: FilesPerDir files per leaf directory and DirsPerGroup
// leaf directories per top-level directory.
const (
	FilesPerDir  = 100
	DirsPerGroup = 32
)

// Path returns the slash-separated relative path of file i.
func Path(i int) string {
	leaf := i / FilesPerDir
	ext := [...]string{".go", ".txt", ".json", ".md", ".c", ".h", ".py", ".bin"}[i%8]
	return fmt.Sprintf("g%03d/d%05d/f%07d%s", leaf/DirsPerGroup, leaf, i, ext)
}

// Size returns the size in bytes of file i for seed: most files are small
// (80% under 2 KiB), some medium (18% 2-16 KiB), few large (2% 16-128 KiB);
// about 3.9 KiB on average.
func Size(seed uint64, i int) int {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	switch p := r.IntN(100); {
	case p < 80:
		return r.IntN(2048)
	case p < 98:
		return 2048 + r.IntN(14*1024)
	default:
		return 16*1024 + r.IntN(112*1024)
	}
}

// Content returns the bytes of file i for seed: text-like lines (as
// compressible as source code) for most files, random bytes for ".bin"
// files. Every file's bytes are its own, so no two files share chunks.
func Content(seed uint64, i int) []byte {
	n := Size(seed, i)
	src := rand.NewChaCha8(seedBytes(seed, uint64(i)))
	b := make([]byte, n)
	if i%8 == 7 {
		_, _ = src.Read(b)
		return b
	}
	r := rand.New(src)
	const words = "the of and to in is that for it as with was on be by this are from at or an have not which but all were when we there can more if out so up one what about into than them only some new could time these two may then do first any my now such like our over man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three"
	col := 0
	for j := 0; j < n; {
		w := r.IntN(len(words) - 8)
		for w > 0 && words[w-1] != ' ' {
			w--
		}
		for ; w < len(words) && words[w] != ' ' && j < n; w++ {
			b[j] = words[w]
			j++
			col++
		}
		if j < n {
			if col > 60 {
				b[j] = '\n'
				col = 0
			} else {
				b[j] = ' '
				col++
			}
			j++
		}
	}
	return b
}

func seedBytes(seed, i uint64) [32]byte {
	var s [32]byte
	for k := 0; k < 8; k++ {
		s[k] = byte(seed >> (8 * k))
		s[8+k] = byte(i >> (8 * k))
	}
	s[16] = 0x7e
	return s
}

// Generate writes files [0, n) of the tree for seed under dir, which is
// created if missing. It uses workers goroutines (at least one).
func Generate(ctx context.Context, dir string, n int, seed uint64, workers int) error {
	if workers < 1 {
		workers = 1
	}
	// Directories first, so the writers never race to create them.
	for leaf := 0; leaf*FilesPerDir < n; leaf++ {
		d := filepath.Join(dir, filepath.Dir(filepath.FromSlash(Path(leaf*FilesPerDir))))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("tree dir %s: %w", d, err)
		}
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				p := filepath.Join(dir, filepath.FromSlash(Path(i)))
				if err := os.WriteFile(p, Content(seed, i), 0o644); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("tree file %s: %w", p, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed || ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("generate tree in %s: %w", dir, err)
	}
	return nil
}

// Changed returns the indices of k files of an n-file tree spread evenly
// over it. When k divides m and m divides n, Changed(n, k) is a subset of
// Changed(n, m), so changes applied in stages of growing k nest.
func Changed(n, k int) []int {
	if k > n {
		k = n
	}
	out := make([]int, 0, k)
	for j := 0; j < k; j++ {
		out = append(out, int(int64(j)*int64(n)/int64(k)))
	}
	return out
}

// Modify appends one line tagged with tag to each file i in idx of the tree
// under dir, so each listed file changes content and size.
func Modify(dir string, idx []int, tag string) error {
	for _, i := range idx {
		p := filepath.Join(dir, filepath.FromSlash(Path(i)))
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("modify %s: %w", p, err)
		}
		_, err = fmt.Fprintf(f, "\nchanged %s %d\n", tag, i)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("modify %s: %w", p, err)
		}
	}
	return nil
}
