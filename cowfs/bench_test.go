package cowfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
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

// BenchmarkPoolFork measures a fork that is ready to use: a new branch from
// a snapshot, served at a directory, up to the first stat of a file in it.
// "pool" binds the branch to a mount made ahead of time (the pool is
// refilled between forks, outside the timer); "mount" is Branch then Mount.
// Both report the median and 90th percentile beside the mean.
func BenchmarkPoolFork(b *testing.B) {
	needFUSE(b)
	ctx := context.Background()
	for _, mode := range []string{"pool", "mount"} {
		b.Run(mode, func(b *testing.B) {
			f := openTestFS(b)
			src := b.TempDir()
			writeTree(b, src, map[string]string{"README": "hi\n", "src/main.go": "package main\n"})
			snap, err := f.Import(ctx, src, "")
			if err != nil {
				b.Fatal(err)
			}
			var p *MountPool
			if mode == "pool" {
				if p, err = f.NewMountPool(ctx, filepath.Join(b.TempDir(), "pool"), 2, nil); err != nil {
					b.Fatal(err)
				}
				defer p.Close()
			}
			mnts := b.TempDir()
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				name := fmt.Sprintf("f%d", i)
				t0 := time.Now()
				var m *Mount
				if p != nil {
					m, err = p.Fork(ctx, snap, name)
				} else {
					dir := filepath.Join(mnts, name)
					if err = os.Mkdir(dir, 0o755); err == nil {
						if err = f.Branch(ctx, snap, name); err == nil {
							m, err = f.Mount(ctx, name, dir, nil)
						}
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				if _, err := os.Lstat(filepath.Join(m.Dir(), "README")); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(t0))
				b.StopTimer()
				if err := m.Unmount(); err != nil {
					b.Fatal(err)
				}
				os.Remove(m.Dir())
				for p != nil && p.Ready() < 2 {
					time.Sleep(100 * time.Microsecond)
				}
				b.StartTimer()
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*9/10].Microseconds()), "p90-µs")
		})
	}
}

// BenchmarkAgentFiles runs the small-file steps of an agent's work on a
// branch and, interleaved with it, on the host directory that holds the
// test's state, and reports each step's time on the branch as a multiple
// of the native time (x-create, x-stat, x-rmrf, x-write-fsync): 1000 files
// of 2 KiB in 20 directories created, stat'ed, removed with their
// directories, then 8 MiB written and fsynced. It also reports each
// step's mean time on the branch (ms-) and natively (native-ms-).
func BenchmarkAgentFiles(b *testing.B) {
	needFUSE(b)
	f := openTestFS(b)
	m, _ := mountNew(b, f, "main", map[string]string{"seed": "x"})
	native := b.TempDir()
	data := pattern(7, 2048)
	big := pattern(9, 8<<20)
	steps := []string{"create", "stat", "rmrf", "write-fsync"}
	took := map[string][2]time.Duration{}
	run := func(root string) map[string]time.Duration {
		t := map[string]time.Duration{}
		top := filepath.Join(root, "work")
		t0 := time.Now()
		for d := range 20 {
			dir := filepath.Join(top, fmt.Sprintf("d%02d", d))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			for i := range 50 {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.go", i)), data, 0o644); err != nil {
					b.Fatal(err)
				}
			}
		}
		t["create"] = time.Since(t0)
		t0 = time.Now()
		for d := range 20 {
			for i := range 50 {
				if _, err := os.Lstat(filepath.Join(top, fmt.Sprintf("d%02d/f%03d.go", d, i))); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := os.Lstat(filepath.Join(top, fmt.Sprintf("d%02d", d))); err != nil {
				b.Fatal(err)
			}
		}
		t["stat"] = time.Since(t0)
		t0 = time.Now()
		if err := os.RemoveAll(top); err != nil {
			b.Fatal(err)
		}
		t["rmrf"] = time.Since(t0)
		t0 = time.Now()
		p := filepath.Join(root, "big")
		fh, err := os.Create(p)
		if err == nil {
			_, err = fh.Write(big)
		}
		if err == nil {
			err = fh.Sync()
		}
		if err != nil {
			b.Fatal(err)
		}
		fh.Close()
		t["write-fsync"] = time.Since(t0)
		os.Remove(p)
		return t
	}
	b.ResetTimer()
	for range b.N {
		nt := run(native)
		tt := run(m.Dir())
		for _, s := range steps {
			v := took[s]
			v[0] += nt[s]
			v[1] += tt[s]
			took[s] = v
		}
	}
	b.StopTimer()
	for _, s := range steps {
		v := took[s]
		b.ReportMetric(float64(v[1])/float64(v[0]), "x-"+s)
		b.ReportMetric(float64(v[1].Microseconds())/float64(b.N)/1000, "ms-"+s)
		b.ReportMetric(float64(v[0].Microseconds())/float64(b.N)/1000, "native-ms-"+s)
	}
}

// BenchmarkDirGetattr measures a create in a directory of 5000 files
// followed by a stat of the directory (the create makes the kernel ask
// for the directory's attributes again, link count included).
func BenchmarkDirGetattr(b *testing.B) {
	needFUSE(b)
	files := map[string]string{}
	for i := range 5000 {
		files[fmt.Sprintf("big/f%04d", i)] = ""
	}
	f := openTestFS(b)
	m, _ := mountNew(b, f, "main", files)
	dir := filepath.Join(m.Dir(), "big")
	b.ResetTimer()
	for i := range b.N {
		fh, err := os.Create(filepath.Join(dir, fmt.Sprintf("n%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		fh.Close()
		if _, err := os.Lstat(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDiff measures the diff of two snapshots of 4000 files in 200
// directories that differ in one file of every tenth directory, as an
// agent's loop asks again and again.
func BenchmarkDiff(b *testing.B) {
	ctx := context.Background()
	f := openTestFS(b)
	src := b.TempDir()
	files := map[string]string{}
	for i := range 4000 {
		files[fmt.Sprintf("d%03d/e/f%04d", i%200, i)] = fmt.Sprint(i)
	}
	writeTree(b, src, files)
	s1, err := f.Import(ctx, src, "")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 200; i += 10 {
		os.WriteFile(filepath.Join(src, fmt.Sprintf("d%03d/e/f%04d", i, i)), []byte("changed"), 0o644)
	}
	s2, err := f.Import(ctx, src, "")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := f.Diff(ctx, s1, s2); err != nil {
			b.Fatal(err)
		}
	}
}
