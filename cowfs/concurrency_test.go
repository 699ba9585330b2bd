package cowfs

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func TestConcurrentWritersAndSnapshots(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	stable := pattern(99, 3<<20)
	m, _ := mountNew(t, f, "main", map[string]string{"stable.bin": string(stable)})
	mnt := m.Dir()

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	const writers = 4
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := pattern(uint64(w), 2<<20)
			fh, err := os.Create(filepath.Join(mnt, fmt.Sprintf("w%d", w)))
			if err != nil {
				errs <- err
				return
			}
			defer fh.Close()
			for off := 0; off < len(data); off += 64 << 10 {
				if _, err := fh.WriteAt(data[off:off+64<<10], int64(off)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// Readers check an unchanged file while snapshots and forks happen.
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	for r := 0; r < 2; r++ {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				got, err := os.ReadFile(filepath.Join(mnt, "stable.bin"))
				if err != nil || !bytes.Equal(got, stable) {
					errs <- fmt.Errorf("reader: stable.bin changed under snapshot (len %d, err %v)", len(got), err)
					return
				}
			}
		}()
	}
	var snaps []SnapshotID
	for i := 0; i < 5; i++ {
		id, err := f.Snapshot(ctx, "main")
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, id)
		if err := f.Branch(ctx, id, fmt.Sprintf("fork%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for w := 0; w < writers; w++ {
		got, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf("w%d", w)))
		if err != nil || !bytes.Equal(got, pattern(uint64(w), 2<<20)) {
			t.Errorf("w%d: wrong content after parallel writes (len %d, err %v)", w, len(got), err)
		}
	}
	// The last fork, mounted, sees a consistent tree: stable.bin intact.
	fm, err := f.Mount(ctx, "fork4", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fm.Unmount()
	got, err := os.ReadFile(filepath.Join(fm.Dir(), "stable.bin"))
	if err != nil || !bytes.Equal(got, stable) {
		t.Errorf("fork: stable.bin wrong (len %d, err %v)", len(got), err)
	}
}

func TestTwoBranchesOfOneSnapshot(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	base := pattern(5, 1<<20)
	ma, snap := mountNew(t, f, "a", map[string]string{"f.bin": string(base), "keep": "k"})
	if err := f.Branch(ctx, snap, "b"); err != nil {
		t.Fatal(err)
	}
	mb, err := f.Mount(ctx, "b", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Unmount()
	var wg sync.WaitGroup
	for i, m := range []*Mount{ma, mb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fh, err := os.OpenFile(filepath.Join(m.Dir(), "f.bin"), os.O_RDWR, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer fh.Close()
			for off := int64(0); off < 1<<20; off += 100000 {
				if _, err := fh.WriteAt([]byte{byte('A' + i)}, off); err != nil {
					t.Error(err)
				}
			}
			os.WriteFile(filepath.Join(m.Dir(), fmt.Sprintf("only-%d", i)), []byte("x"), 0o644)
		}()
	}
	wg.Wait()
	for i, m := range []*Mount{ma, mb} {
		got, err := os.ReadFile(filepath.Join(m.Dir(), "f.bin"))
		if err != nil {
			t.Fatal(err)
		}
		want := bytes.Clone(base)
		for off := 0; off < 1<<20; off += 100000 {
			want[off] = byte('A' + i)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("branch %d: f.bin mixes in the other branch's writes", i)
		}
		if _, err := os.Stat(filepath.Join(m.Dir(), fmt.Sprintf("only-%d", 1-i))); !os.IsNotExist(err) {
			t.Errorf("branch %d sees the other branch's file (err %v)", i, err)
		}
	}
}

// TestSmallWriteCostsOneChunk checks copy-on-write below file granularity:
// one byte written into a big file adds about one chunk to the store.
func TestSmallWriteCostsOneChunk(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	const size = 64 << 20
	big := pattern(1, size)
	m, base := mountNew(t, f, "main", map[string]string{"big.bin": string(big)})
	before := f.Store().Stats()
	fh, err := os.OpenFile(filepath.Join(m.Dir(), "big.bin"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte{^big[size/2]}, size/2); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	snap, err := f.Snapshot(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	after := f.Store().Stats()
	grew := after.UniqueBytes - before.UniqueBytes
	nodes := after.NodeBytes - before.NodeBytes
	t.Logf("1-byte write into %d MiB file: +%d chunk bytes, +%d node bytes", size>>20, grew, nodes)
	if grew > 512<<10 {
		t.Errorf("store grew by %d chunk bytes for a 1-byte write; want at most 512 KiB", grew)
	}
	if nodes > 256<<10 {
		t.Errorf("store grew by %d node bytes; want at most 256 KiB", nodes)
	}
	ch, err := f.Diff(ctx, base, snap)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch) != 1 || ch[0].Path != "big.bin" || ch[0].Kind != Modified {
		t.Errorf("diff = %+v, want one modified big.bin", ch)
	}
	got, err := os.ReadFile(filepath.Join(m.Dir(), "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	big[size/2] = ^big[size/2]
	if !bytes.Equal(got, big) {
		t.Error("big.bin content wrong after snapshot")
	}
}
