package cowfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A branch whose small files fill its memory budget stores them in the
// background and commits: memory is freed, only the write that found the
// budget full went to an overlay file, the head moves, and every file
// reads back, also after a remount. A file written while the flush cut
// it keeps the newer bytes.
func TestMemFlushBehind(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	const budget = 4 << 20
	f := openTestFSWith(t, &Options{BranchMemBytes: budget, MemBytes: 64 << 20})
	m, _ := mountNew(t, f, "main", map[string]string{"seed": "x"})
	head0, _, err := f.getRef(refBranch + "main")
	if err != nil {
		t.Fatal(err)
	}
	late := pattern(999, 3000)
	hookRan := make(chan struct{})
	hook := func() {
		// f000 was frozen with its first bytes: this write makes the
		// flush's copy stale, so the flush must keep the new bytes.
		if err := os.WriteFile(filepath.Join(m.Dir(), "f000"), late, 0o644); err != nil {
			t.Error(err)
		}
		close(hookRan)
	}
	flushMemTestHook.Store(&hook)
	t.Cleanup(func() { flushMemTestHook.Store(nil) })
	flushing := func() bool {
		m.b.mu.Lock()
		defer m.b.mu.Unlock()
		return m.b.memFlush
	}

	want := map[string][]byte{}
	const size = 10 << 10
	// Write until a write finds the budget full and starts the flush.
	for i := 0; !flushing(); i++ {
		if i > 2*budget/size {
			t.Fatalf("no flush began after %d files of %d bytes (budget %d)", i, size, budget)
		}
		name := fmt.Sprintf("f%03d", i)
		want[name] = pattern(uint64(i), size)
		if err := os.WriteFile(filepath.Join(m.Dir(), name), want[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-hookRan:
	case <-time.After(10 * time.Second):
		t.Fatal("the flush did not cut its files")
	}
	want["f000"] = late
	deadline := time.Now().Add(10 * time.Second)
	for flushing() {
		if time.Now().After(deadline) {
			t.Fatal("the flush did not end")
		}
		time.Sleep(time.Millisecond)
	}
	head1, _, err := f.getRef(refBranch + "main")
	if err != nil {
		t.Fatal(err)
	}
	if head1 == head0 {
		t.Error("the flush did not commit: the branch's head did not move")
	}
	// The commit that ends the flush stored f000's new bytes too.
	if n := f.memInUse(); n != 0 {
		t.Errorf("%d bytes in memory after the flush, want none", n)
	}
	if names := overlayFileNames(t, f, "main"); len(names) > 1 {
		t.Errorf("%d overlay files on disk, want at most the one that found the budget full: %v", len(names), names[:min(5, len(names))])
	}
	for name, w := range want {
		mustRead(t, filepath.Join(m.Dir(), name), w)
	}
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	m2, err := f.Mount(ctx, "main", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Unmount()
	for name, w := range want {
		mustRead(t, filepath.Join(m2.Dir(), name), w)
	}
}

// A branch with less than memFlushMin in memory is never flushed behind
// its back, even with its budget full: small budgets keep the plain
// spill of ADR 0164.
func TestMemFlushNotForLittle(t *testing.T) {
	needFUSE(t)
	f := openTestFSWith(t, &Options{BranchMemBytes: 64 << 10, MemBytes: 1 << 20})
	m, _ := mountNew(t, f, "main", map[string]string{"seed": "x"})
	head0, _, err := f.getRef(refBranch + "main")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(m.Dir(), fmt.Sprint(i)), pattern(uint64(i), 4000), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	head1, _, err := f.getRef(refBranch + "main")
	if err != nil {
		t.Fatal(err)
	}
	if head1 != head0 {
		t.Error("a branch holding less than memFlushMin was committed behind its back")
	}
}

// A flush that stores nothing (here every frozen file is written again
// while it is cut) makes the branch wait memFlushBackoff before the next
// one, so that writes into a full budget do not start the same futile
// flush again and again.
func TestMemFlushBacksOff(t *testing.T) {
	needFUSE(t)
	const budget = 2 << 20
	f := openTestFSWith(t, &Options{BranchMemBytes: budget, MemBytes: 64 << 20})
	m, _ := mountNew(t, f, "main", map[string]string{"seed": "x"})
	const size = 10 << 10
	var (
		mu    sync.Mutex // names: appended here, read by the hook on the flush's goroutine
		names []string
	)
	hookRan := make(chan struct{})
	hook := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, name := range names {
			if err := os.WriteFile(filepath.Join(m.Dir(), name), pattern(7, size), 0o644); err != nil {
				t.Error(err)
			}
		}
		close(hookRan)
	}
	flushMemTestHook.Store(&hook)
	t.Cleanup(func() { flushMemTestHook.Store(nil) })
	state := func() (flushing bool, after time.Time) {
		m.b.mu.Lock()
		defer m.b.mu.Unlock()
		return m.b.memFlush, m.b.memFlushAfter
	}
	for i := 0; ; i++ {
		if busy, _ := state(); busy {
			break
		}
		if i > 2*budget/size {
			t.Fatalf("no flush began after %d files", i)
		}
		name := fmt.Sprintf("f%03d", i)
		mu.Lock()
		names = append(names, name)
		mu.Unlock()
		if err := os.WriteFile(filepath.Join(m.Dir(), name), pattern(uint64(i), size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	<-hookRan
	deadline := time.Now().Add(10 * time.Second)
	for {
		busy, after := state()
		if !busy {
			if !after.After(time.Now()) {
				t.Fatal("a flush that stored nothing set no backoff")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flush did not end")
		}
		time.Sleep(time.Millisecond)
	}
	// The budget is still full: a write that finds it so starts no flush
	// during the backoff.
	if err := os.WriteFile(filepath.Join(m.Dir(), "more"), pattern(8, size), 0o644); err != nil {
		t.Fatal(err)
	}
	if busy, _ := state(); busy {
		t.Error("a flush began during the backoff")
	}
	for _, name := range names {
		mustRead(t, filepath.Join(m.Dir(), name), pattern(7, size))
	}
}
