package cowfs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"tine/chunkstore"
)

// TestBackingRegisteredOnce checks ADR 0188: a content id is registered
// with a mount once, kept after its last handle is released, shared by
// the files that hold it, bounded when idle, dropped for eviction and
// pruning, and forgotten with the mount.
func TestBackingRegisteredOnce(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	// Files of passthroughMin bytes, the smallest read with passthrough.
	big := func(seed uint64) string { return string(pattern(seed, passthroughMin)) }
	files := map[string]string{"a": big(1), "a2": big(1), "b": big(2), "c": big(3), "d": big(4)}
	m, _ := mountNew(t, f, "main", files)
	bk := m.b.backings
	read := func(name string) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(m.Dir(), name))
		if err != nil || !bytes.Equal(got, []byte(files[name])) {
			t.Fatalf("read %s: %q, %v", name, got, err)
		}
	}
	// entry returns the registration of name's content once its handles
	// are released (the kernel sends RELEASE after close returns), nil if
	// there is none.
	entry := func(name string) *backing {
		t.Helper()
		id, err := chunkstore.ParseID(mustID(t, f, "main", name))
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			bk.set.mu.Lock()
			e := bk.byID[id]
			idle := e != nil && e.handles == 0
			bk.set.mu.Unlock()
			if idle || time.Now().After(deadline) {
				return e
			}
		}
	}

	read("a")
	first := entry("a")
	if first == nil {
		t.Fatal("after reading a: no registration kept")
	}
	read("a")
	read("a2")
	if e := entry("a"); e != first || e.bid != first.bid {
		t.Errorf("a read again, and a2 with the same content: registration %p (id %d), want the first, %p (id %d)", e, e.bid, first, first.bid)
	}

	setMax := func(n int) {
		bk.set.mu.Lock()
		maxIdleBackings = n
		bk.set.mu.Unlock()
	}
	defer setMax(maxIdleBackings)
	setMax(2)
	for _, name := range []string{"b", "c", "d"} {
		read(name)
		entry(name)
	}
	bk.set.mu.Lock()
	idle, registered := bk.set.idle.Len(), len(bk.byID)
	bk.set.mu.Unlock()
	if idle != 2 || registered != 2 {
		t.Errorf("after reading 4 contents with room for 2 idle: %d idle, %d registered", idle, registered)
	}
	for name := range files {
		read(name) // dropped registrations are made again
	}

	// Pruning ends the idle registrations, which hold the cache files
	// in use; the files read the same after.
	for _, name := range []string{"b", "c"} {
		read(name)
		if entry(name) == nil {
			t.Fatalf("%s read last: no registration", name)
		}
	}
	if err := f.PruneCache(); err != nil {
		t.Fatal(err)
	}
	bk.set.mu.Lock()
	registered = len(bk.byID)
	bk.set.mu.Unlock()
	if registered != 0 {
		t.Errorf("after PruneCache: %d registrations left", registered)
	}
	for name := range files {
		read(name)
	}

	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	bk.set.mu.Lock()
	defer bk.set.mu.Unlock()
	if bk.set.tables[bk] || bk.set.idle.Len() != 0 {
		t.Errorf("after unmount: table kept %v, %d idle registrations", bk.set.tables[bk], bk.set.idle.Len())
	}
}
