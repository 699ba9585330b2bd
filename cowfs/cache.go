package cowfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// DefaultCacheBytes is the passthrough cache's budget when
// Options.CacheBytes is zero.
const DefaultCacheBytes = 1 << 30

// errTooBig reports a file larger than the whole cache budget.
var errTooBig = errors.New("file is larger than the cache budget")

// The passthrough read cache (root/cache) holds one plain file per content
// id, which the kernel reads directly. Every open of a cache file holds a
// shared flock on it until its handle is released; eviction takes an
// exclusive one, so it never counts a file in use as freed. A cache file's
// mtime is its last use, to within useGrain.
const useGrain = time.Minute

func (f *FS) cacheDir() string { return filepath.Join(f.root, "cache") }

// cacheFile materialises file object id into the read cache, once per
// content id, and opens it, marked in use. It evicts least recently used
// files to keep the cache within its budget.
func (f *FS) cacheFile(ctx context.Context, id chunkstore.ID, size int64) (*os.File, error) {
	path := f.cacheFilePath(id)
	if fh, err := f.openCached(path, size); err == nil {
		return fh, nil
	}
	if size > f.cacheBytes {
		return nil, fmt.Errorf("cache %s: %w (%d > %d bytes)", id, errTooBig, size, f.cacheBytes)
	}
	f.matMu.Lock()
	defer f.matMu.Unlock()
	if fh, err := f.openCached(path, size); err == nil {
		return fh, nil
	}
	if err := f.materialise(id, size, path); err != nil {
		return nil, err
	}
	f.cacheUsed += size
	fh, err := f.openCached(path, size)
	if err != nil {
		return nil, fmt.Errorf("cache %s: %w", id, err)
	}
	// Evict only now: the new file is in use and stays.
	if err := f.evictLocked(f.cacheBytes); err != nil {
		fh.Close()
		return nil, err
	}
	return fh, nil
}

// cacheFilePath is where the cache holds content id.
func (f *FS) cacheFilePath(id chunkstore.ID) string {
	return filepath.Join(f.cacheDir(), id.String())
}

// markUsed sets a cache file's mtime to now: its last use, which
// eviction goes by.
func markUsed(path string) {
	now := time.Now()
	os.Chtimes(path, now, now)
}

// openCached opens the cache file at path, through the cache's read-only
// view, if it holds size bytes, takes a shared lock on it and records the
// use.
func (f *FS) openCached(path string, size int64) (*os.File, error) {
	fh, err := f.openView(filepath.Base(path))
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	err = unix.Fstat(int(fh.Fd()), &st)
	if err == nil && st.Size != size {
		err = fmt.Errorf("cache file %s: %d bytes, want %d", path, st.Size, size)
	}
	if err == nil {
		err = unix.Flock(int(fh.Fd()), unix.LOCK_SH)
	}
	if err != nil {
		fh.Close()
		return nil, err
	}
	if time.Since(time.Unix(st.Mtim.Unix())) > useGrain {
		markUsed(path)
	}
	return fh, nil
}

// materialise writes file object id to path. Caller holds matMu.
func (f *FS) materialise(id chunkstore.ID, size int64, path string) error {
	refs, total, err := getFile(f.store, id)
	if err != nil {
		return err
	}
	if total != size {
		return fmt.Errorf("cache %s: %w: %d bytes, want %d", id, errCorrupt, total, size)
	}
	tmp, err := os.CreateTemp(f.cacheDir(), ".tmp-")
	if err != nil {
		return fmt.Errorf("cache %s: %w", id, err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := writeChunks(f.store, refs, tmp); err != nil {
		return fmt.Errorf("cache %s: %w", id, err)
	}
	if err := tmp.Truncate(size); err != nil {
		return fmt.Errorf("cache %s: truncate %s: %w", id, tmp.Name(), err)
	}
	if err := os.Chmod(tmp.Name(), 0o400); err != nil {
		return fmt.Errorf("cache %s: %w", id, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("cache %s: %w", id, err)
	}
	return nil
}

// writeChunks writes the chunks refs name into w at their offsets, on
// as many goroutines as there are CPUs: each chunk's read (and hash
// check, and decompression) is CPU work, and the open that waits for it
// is the first read of the file.
func writeChunks(store *chunkstore.Store, refs []fileRef, w io.WriterAt) error {
	offs := make([]int64, len(refs))
	var off int64
	for i, r := range refs {
		offs[i] = off
		off += r.Size
	}
	var (
		next  atomic.Int64
		first atomic.Pointer[error]
		wg    sync.WaitGroup
	)
	for range min(runtime.GOMAXPROCS(0), len(refs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first.Load() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(refs) {
					return
				}
				if refs[i].ID.IsZero() {
					continue // a hole
				}
				d, err := store.View(refs[i].ID)
				if err != nil {
					err = fmt.Errorf("read chunk %s: %w", refs[i].ID, err)
				} else if _, err = w.WriteAt(d, offs[i]); err != nil {
					err = fmt.Errorf("write: %w", err)
				}
				if err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return *err
	}
	return nil
}

// trimCache counts what the cache holds, removes files left half-written
// by a crash, and evicts down to the budget. Open calls it.
func (f *FS) trimCache() error {
	f.matMu.Lock()
	defer f.matMu.Unlock()
	ents, err := os.ReadDir(f.cacheDir())
	if err != nil {
		return fmt.Errorf("read cache %s: %w", f.cacheDir(), err)
	}
	f.cacheUsed = 0
	for _, e := range ents {
		p := filepath.Join(f.cacheDir(), e.Name())
		if strings.HasPrefix(e.Name(), ".tmp-") {
			os.Remove(p)
			continue
		}
		if info, err := e.Info(); err == nil {
			f.cacheUsed += info.Size()
		}
	}
	return f.evictLocked(f.cacheBytes)
}

// evictLocked removes least recently used cache files that no handle
// uses until the cache holds at most budget bytes. Caller holds matMu.
func (f *FS) evictLocked(budget int64) error {
	if f.cacheUsed <= budget {
		return nil
	}
	ents, err := os.ReadDir(f.cacheDir())
	if err != nil {
		return fmt.Errorf("read cache %s: %w", f.cacheDir(), err)
	}
	type cached struct {
		path string
		size int64
		used time.Time
	}
	var cs []cached
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if info, err := e.Info(); err == nil {
			cs = append(cs, cached{filepath.Join(f.cacheDir(), e.Name()), info.Size(), info.ModTime()})
		}
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].used.Before(cs[j].used) })
	for _, c := range cs {
		if f.cacheUsed <= budget {
			break
		}
		if evictIdle(c.path) || f.dropIdleBacking(c.path) && evictIdle(c.path) {
			f.cacheUsed -= c.size
		}
	}
	return nil
}

// dropIdleBacking ends the mounts' idle registrations of the cache file
// at path (backing.go), which hold it in use, and reports whether there
// were any.
func (f *FS) dropIdleBacking(path string) bool {
	id, err := chunkstore.ParseID(filepath.Base(path))
	return err == nil && f.backings.dropIdle(id)
}

// evictIdle removes the cache file at path unless a handle uses it.
func evictIdle(path string) bool {
	fh, err := os.Open(path)
	if err != nil {
		return false
	}
	defer fh.Close()
	if unix.Flock(int(fh.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false // in use
	}
	return os.Remove(path) == nil
}

// PruneCache empties the passthrough read cache. Files open now keep
// reading their cache file (its space is freed when they close); later
// opens materialise it again.
func (f *FS) PruneCache() error {
	f.matMu.Lock()
	defer f.matMu.Unlock()
	f.backings.dropIdle(chunkstore.ID{})
	ents, err := os.ReadDir(f.cacheDir())
	if err != nil {
		return fmt.Errorf("prune cache: %w", err)
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(f.cacheDir(), e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("prune cache: %w", err)
		}
	}
	f.cacheUsed = 0
	return nil
}
