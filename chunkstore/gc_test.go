package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestGC(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir, &Options{PackSize: 512 << 10, GCGrace: -1})
	// Three "files" of 40 chunks each; a tree node links two of them.
	files := make([][]ID, 3)
	for f := range files {
		for i := range 40 {
			id, err := s.Put(randBytes(uint64(f*1000+i), 8000))
			if err != nil {
				t.Fatal(err)
			}
			files[f] = append(files[f], id)
		}
	}
	fileNode := make([]ID, 3)
	for f := range files {
		fileNode[f], _ = s.PutNode(files[f], []byte{byte(f)})
	}
	root, _ := s.PutNode([]ID{fileNode[0], {}, fileNode[1]}, []byte("root"))
	if err := s.SetRef("snapshots/1", ID{}, root); err != nil {
		t.Fatal(err)
	}
	extra, _ := s.Put([]byte("kept by extra root"))
	before := s.Stats()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	diskBefore := packBytes(t, dir)
	st, err := s.GC(ctx, extra)
	if err != nil {
		t.Fatal(err)
	}
	if diskAfter := packBytes(t, dir); st.PacksRepacked+st.PacksDeleted == 0 || diskAfter >= diskBefore {
		t.Fatalf("GC %+v: pack files %d -> %d bytes; want packs rewritten or deleted and space freed", st, diskBefore, diskAfter)
	}
	// Live: root + 2 file nodes + 80 chunks + extra = 84.
	if st.Live != 84 || st.Deleted != 41 {
		t.Fatalf("GC stats %+v, want 84 live and 41 deleted", st)
	}
	for f, ids := range files {
		for _, id := range ids {
			if got := s.Has(id); got != (f != 2) {
				t.Fatalf("file %d chunk Has = %v after GC", f, got)
			}
		}
	}
	if s.Has(fileNode[2]) || !s.Has(extra) || !s.Has(root) {
		t.Fatal("GC kept or dropped the wrong nodes")
	}
	after := s.Stats()
	if after.StoredBytes >= before.StoredBytes {
		t.Fatalf("stored bytes %d -> %d: GC freed nothing", before.StoredBytes, after.StoredBytes)
	}
	check := func(s *Store) {
		t.Helper()
		rep, err := s.Verify(ctx)
		if err != nil || !rep.OK() {
			t.Fatalf("Verify after GC: %v %v", err, rep.Damaged)
		}
		for f := range 2 {
			for i, id := range files[f] {
				b, err := s.Get(id)
				if err != nil || !bytes.Equal(b, randBytes(uint64(f*1000+i), 8000)) {
					t.Fatalf("Get file %d chunk %d after GC: %v", f, i, err)
				}
			}
		}
	}
	check(s)
	s.Close()
	s = openT(t, dir, &Options{GCGrace: -1})
	defer s.Close()
	check(s)
	if s.Has(fileNode[2]) {
		t.Fatal("swept node back after reopen")
	}
	// Dropping the last ref and GCing again empties the store.
	if err := s.DeleteRef("snapshots/1", root); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Chunks+st.Nodes != 0 || st.Packs != 0 {
		t.Fatalf("store not empty after GC with no roots: %+v", st)
	}
}

// TestGCConcurrentPuts runs GCs while other goroutines put data and set
// refs; everything referenced must survive.
func TestGCConcurrentPuts(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), &Options{PackSize: 256 << 10, GCGrace: time.Second})
	defer s.Close()
	deadline := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var iters sync.WaitGroup
	iters.Add(90)
	var itersMu sync.Mutex
	itersLeft := 90
	errs := make(chan error, 8)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Reuse chunks across iterations so that dedup hits old,
				// possibly dead, objects while GC runs.
				data := randBytes(uint64(w*100000+i%7), 50000)
				refs, err := s.PutStream(ctx, bytes.NewReader(data))
				if err != nil {
					errs <- err
					return
				}
				links := make([]ID, len(refs))
				for j, r := range refs {
					links[j] = r.ID
				}
				node, err := s.PutNode(links, []byte{byte(w), byte(i)})
				if errors.Is(err, ErrNotFound) {
					continue // a chunk deduplicated over GCGrace ago was collected
				}
				if err != nil {
					errs <- err
					return
				}
				name := "w/" + string(rune('a'+w)) + "/" + string(rune('a'+i%20))
				old, _ := s.GetRef(name)
				if err := s.SetRef(name, old, node); err != nil {
					errs <- err
					return
				}
				itersMu.Lock()
				if itersLeft > 0 {
					itersLeft--
					iters.Done()
				}
				itersMu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { iters.Wait(); close(done) }()
	gcs := 0
	var deleted int64
	for loop := true; loop; gcs++ {
		st, err := s.GC(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deleted += st.Deleted
		select {
		case <-done:
			loop = gcs < 8 || time.Now().Before(deadline)
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d GCs deleted %d objects during the puts: %+v", gcs, deleted, s.Stats())
	if deleted == 0 {
		t.Fatal("no GC deleted anything: the test did not exercise sweeping")
	}
	if _, err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Verify(ctx)
	if err != nil || !rep.OK() {
		t.Fatalf("Verify: %v %v", err, rep.Damaged)
	}
	refs, _ := s.ListRefs("")
	for name, id := range refs {
		links, _, err := s.GetNode(id)
		if err != nil {
			t.Fatalf("ref %s: %v", name, err)
		}
		for _, l := range links {
			if _, err := s.Get(l); err != nil && !errors.Is(err, ErrNotFound) || !s.Has(l) {
				t.Fatalf("ref %s: chunk %s lost: %v", name, l, err)
			}
		}
	}
}

// packBytes sums the sizes of the pack files of the store in dir.
func packBytes(t *testing.T, dir string) int64 {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "packs", "*.pack"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range m {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		n += st.Size()
	}
	return n
}
