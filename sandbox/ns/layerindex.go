package ns

import (
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A layerIndex records, for the regular files a copy of a sandbox's own
// layer made, what each source file was when it was read and where its
// copy lies, so that the next copy of the same layer (the next snapshot)
// links the files that did not change instead of copying them again
// (docs/adr/0207). Copies are never written (a snapshot's layer is only
// stacked, read-only, or copied), so a link to one is a copy.
type layerIndex struct {
	root  string             // the copy's root directory, where it lies now
	src   fileID             // the source layer's root directory
	files map[fileID]indexed // source file -> what it was, and its copy
	seq   uint64             // when it was kept (Runtime.captures)
	bytes int                // its memory, as entryBytes counts it
}

// fileID names a file: its device and inode.
type fileID struct{ dev, ino uint64 }

// indexed is one source file as it was read and the path of its copy
// below the copy's root.
type indexed struct {
	stamp stamp
	rel   string
}

// stamp is what changes when a file's bytes or attributes change: any
// write, truncate, chmod, chown or xattr change sets its ctime, which no
// process can set back.
type stamp struct {
	size         int64
	ctime, mtime unix.Timespec
	mode         uint32
	nlink        uint64
}

func stampOf(st *unix.Stat_t) stamp {
	return stamp{size: st.Size, ctime: st.Ctim, mtime: st.Mtim, mode: st.Mode, nlink: st.Nlink}
}

// maxIndexBytes bounds the daemon memory one index takes (entryBytes
// each); files beyond it are copied every time. The sandbox names its
// files, so a path may be 4 KiB long: the bound is in bytes, not files.
const maxIndexBytes = 16 << 20

// entryBytes is what an index entry for a copy at rel costs in memory,
// about.
func entryBytes(rel string) int { return 128 + len(rel) }

// add records that the source file id, as stamped, has its copy at rel,
// if the index has room.
func (x *layerIndex) add(id fileID, s stamp, rel string) {
	if x == nil {
		return // a copy that keeps no index
	}
	if n := entryBytes(rel); x.bytes+n <= maxIndexBytes {
		x.files[id] = indexed{stamp: s, rel: rel}
		x.bytes += n
	}
}

// racyWindow is how much older than the copy's start a file's ctime must
// be for the file to be recorded: a change made after the read gets a
// later ctime even from a clock that ticks coarsely (git's racily-clean
// rule).
const racyWindow = 50 * time.Millisecond

// settled reports whether a later change to the file fd (stat st, read
// by a copy that began at start) is sure to show in its stamp: its
// ctime is older than the copy by more than a clock tick, and none of
// its pages is dirty. A page written through a shared mapping sets the
// times only when it turns dirty, so a page dirty now could be written
// again, unseen, until it is written back.
func settled(fd int, st *unix.Stat_t, start time.Time) bool {
	if time.Unix(st.Ctim.Unix()).After(start.Add(-racyWindow)) {
		return false
	}
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: 0, Len: 0}, &cs, 0); err != nil {
		return false // no cachestat (Linux < 6.5): nothing is recorded
	}
	return cs.Dirty == 0 && cs.Writeback == 0
}

// reuse links the copy x holds of the source file st to to, if the file
// is unchanged since that copy read it, and reports whether it did. A
// copy gone (its snapshot removed) is not used; a copy is never changed
// (its directories are the copy's own, so the link reaches the file the
// index names or nothing).
func (x *layerIndex) reuse(st *unix.Stat_t, to string) (indexed, bool) {
	e, ok := x.holds(st)
	if !ok {
		return indexed{}, false
	}
	if unix.Link(filepath.Join(x.root, e.rel), to) != nil {
		return indexed{}, false // gone, too many links, or another file system: copied
	}
	return e, true
}

// holds returns x's entry for the source file st if x (nil: none)
// holds it unchanged.
func (x *layerIndex) holds(st *unix.Stat_t) (indexed, bool) {
	if x == nil {
		return indexed{}, false
	}
	e, ok := x.files[fileID{st.Dev, st.Ino}]
	return e, ok && e.stamp == stampOf(st)
}

// captures keeps the index of the last copy of each sandbox's own layer,
// for the few sandboxes snapshotted last.
type captures struct {
	mu   sync.Mutex
	last map[string]*layerIndex // sandbox runtime directory -> index
	pre  map[string]*layerIndex // a capture's destination -> its pre-copy's index
	seq  uint64
}

// setPre keeps x, the index of a pre-copy, for the capture into to.
func (c *captures) setPre(to string, x *layerIndex) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pre == nil || len(c.pre) >= maxCaptures { // left by captures that never came
		c.pre = map[string]*layerIndex{}
	}
	c.pre[to] = x
}

// takePre returns and forgets the index of the pre-copy for the capture
// into to, or nil.
func (c *captures) takePre(to string) *layerIndex {
	c.mu.Lock()
	defer c.mu.Unlock()
	x := c.pre[to]
	delete(c.pre, to)
	return x
}

// maxCaptures and maxCaptureBytes bound the sandboxes whose last copy
// is remembered and the memory their indexes take together.
const (
	maxCaptures     = 32
	maxCaptureBytes = 64 << 20
)

// get returns the index of the last copy of the layer at dir/upper if
// that layer is still the directory the copy read (a rollback or a
// removal makes a new one).
func (c *captures) get(dir string) *layerIndex {
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(dir, upperDir), &st) != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	x := c.last[dir]
	if x == nil || x.src != (fileID{st.Dev, st.Ino}) {
		return nil
	}
	return x
}

// put remembers x as the last copy of dir's layer, forgetting the least
// recently kept index beyond maxCaptures.
func (c *captures) put(dir string, x *layerIndex) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]*layerIndex{}
	}
	c.seq++
	x.seq = c.seq
	c.last[dir] = x
	for {
		total, oldest := 0, ""
		for d, y := range c.last {
			total += y.bytes
			if oldest == "" || y.seq < c.last[oldest].seq {
				oldest = d
			}
		}
		if len(c.last) <= maxCaptures && total <= maxCaptureBytes {
			return
		}
		delete(c.last, oldest)
	}
}
