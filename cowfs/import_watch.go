package cowfs

import (
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The import watch lets Import of a directory that did not change since
// its last import in this process return that import's snapshot without
// walking the tree. Each directory of an imported tree gets an inotify
// watch before its entries are read; any event under the tree since then
// (a write, truncate, chmod, xattr change, create, delete or rename of an
// entry, or the directory itself moved or deleted) makes the next Import
// walk it again, as does an overflow of the kernel's event queue.
//
// A tree is not watched, and is always walked, when it holds a file with
// more than one hard link (it can change through a name outside the
// tree), when a directory of it is on a filesystem whose changes may come
// from elsewhere (network and FUSE filesystems: only local ones are
// trusted), or when it has more directories than the watch budget has
// left. Two kinds of change raise no event in the tree's directories:
// writes made only through a shared writable mapping of a file (mmap),
// and writes through a hard link made from outside the tree after the
// import. Such a change is seen by the next walk, which happens after
// any other change under the tree, or in a new process.

// maxImportWatches bounds the inotify watches one FS holds (each costs
// about 1 KiB of kernel memory and counts against the user's
// fs.inotify.max_user_watches). A variable for tests.
var maxImportWatches = 16384

// watchMask is the events that mean a change under a watched directory.
const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ONLYDIR

// localFS lists the filesystems (statfs magic) whose every change goes
// through this kernel's VFS and so raises inotify events.
var localFS = map[int64]bool{
	0xEF53:     true, // ext2/3/4
	0x58465342: true, // xfs
	0x9123683E: true, // btrfs
	0x01021994: true, // tmpfs
	0xF2F52010: true, // f2fs
	0xCA451A4E: true, // bcachefs
	0x2FC12FC1: true, // zfs
	0x794C7630: true, // overlayfs
}

// importWatcher holds the watched trees of one FS.
type importWatcher struct {
	mu    sync.Mutex
	fd    int                           // inotify instance; -1 once closed or when none could be made
	trees map[string]*watchTree         // the last import's tree of each directory given to Import
	walks map[*watchTree]bool           // trees of imports walking now
	wds   map[int32]map[*watchTree]bool // watch descriptor -> trees using it
	held  int                           // watches held, under maxImportWatches
	buf   []byte
}

// watchTree is one import's tree. While armed, nothing under it changed
// since its import began, and snap is what that import stored. A tree
// that saw a change keeps its watches until the next import of its
// directory has watched that directory's tree again: giving a watch back
// costs the kernel far more than adding one it holds already.
type watchTree struct {
	dir    string
	top    [2]uint64 // device and inode of dir
	snap   SnapshotID
	wds    []int32
	armed  bool
	failed bool // not watchable: the tree must be walked next time
}

func newImportWatcher() *importWatcher {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		fd = -1
	}
	return &importWatcher{fd: fd, trees: map[string]*watchTree{}, walks: map[*watchTree]bool{}, wds: map[int32]map[*watchTree]bool{}}
}

// close drops every watch.
func (w *importWatcher) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
	w.trees, w.wds, w.held = map[string]*watchTree{}, map[int32]map[*watchTree]bool{}, 0
	for t := range w.walks {
		t.failed, t.wds = true, nil
	}
}

// unchanged returns the snapshot of dir's last import when nothing under
// it changed since, and ok false otherwise.
func (w *importWatcher) unchanged(dir string) (SnapshotID, bool) {
	if w == nil {
		return SnapshotID{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	t := w.trees[dir]
	if t == nil || !t.armed {
		return SnapshotID{}, false
	}
	var st unix.Stat_t
	if err := unix.Fstatat(unix.AT_FDCWD, dir, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || [2]uint64{st.Dev, st.Ino} != t.top {
		t.armed = false // the path names another directory now
		return SnapshotID{}, false
	}
	return t.snap, true
}

// begin starts watching a new import of dir; the walk adds each directory
// with add before reading it.
func (w *importWatcher) begin(dir string) *watchTree {
	if w == nil {
		return nil
	}
	t := &watchTree{dir: dir}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		t.failed = true
	}
	w.walks[t] = true
	return t
}

// add watches directory d (open, the tree's top when top is set) of
// tree t. Anything that keeps it from being watched marks t failed.
func (w *importWatcher) add(t *watchTree, d int, st *unix.Stat_t, top bool) {
	if t == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if t.failed {
		return
	}
	if top {
		t.top = [2]uint64{st.Dev, st.Ino}
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(d, &fs); err != nil || !localFS[int64(fs.Type)] || w.fd < 0 {
		w.fail(t)
		return
	}
	if w.held >= maxImportWatches {
		w.evict(t.dir)
	}
	if w.held >= maxImportWatches {
		w.fail(t)
		return
	}
	// The descriptor's /proc link names the very directory looked at,
	// whatever was renamed since.
	wd, err := unix.InotifyAddWatch(w.fd, procFD(d), watchMask)
	if err != nil {
		w.fail(t)
		return
	}
	users := w.wds[int32(wd)]
	if users == nil {
		users = map[*watchTree]bool{}
		w.wds[int32(wd)] = users
		w.held++
	}
	if !users[t] {
		users[t] = true
		t.wds = append(t.wds, int32(wd))
	}
}

// evict gives back the watches of trees that saw a change, but those of
// directory dir, whose import is walking.
func (w *importWatcher) evict(dir string) {
	for d, t := range w.trees {
		if !t.armed && d != dir {
			delete(w.trees, d)
			w.release(t)
		}
	}
}

// notWatchable marks t failed (a file with several hard links, say).
func (w *importWatcher) notWatchable(t *watchTree) {
	if t == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fail(t)
}

// end arms t with the snapshot its import stored, in place of the tree of
// the last import of the same directory, whose watches are given back
// unless t holds them too. A failed import (err) or an unwatchable tree
// gives back both trees' watches.
func (w *importWatcher) end(t *watchTree, snap SnapshotID, err error) {
	if t == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.walks, t)
	if old := w.trees[t.dir]; old != nil {
		delete(w.trees, t.dir)
		defer w.release(old) // after t took its watches
	}
	if err != nil || t.failed || w.fd < 0 {
		w.fail(t)
		return
	}
	// Events raised during the walk are still queued: the next unchanged
	// drains them and disarms t if any concerns it.
	t.snap, t.armed = snap, true
	w.trees[t.dir] = t
}

// fail gives t's watches back and marks it failed.
func (w *importWatcher) fail(t *watchTree) {
	t.failed = true
	w.release(t)
}

// release gives back the watches t holds that no other tree uses.
func (w *importWatcher) release(t *watchTree) {
	for _, wd := range t.wds {
		users := w.wds[wd]
		delete(users, t)
		if len(users) == 0 {
			delete(w.wds, wd)
			w.held--
			if w.fd >= 0 {
				unix.InotifyRmWatch(w.fd, uint32(wd))
			}
		}
	}
	t.wds = nil
}

// drain reads every queued event and disarms the trees they concern; an
// overflow of the queue disarms every tree.
func (w *importWatcher) drain() {
	if w.fd < 0 {
		return
	}
	if w.buf == nil {
		w.buf = make([]byte, 64<<10)
	}
	for {
		n, err := unix.Read(w.fd, w.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return // EAGAIN: the queue is empty
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				for _, t := range w.trees {
					t.armed = false
				}
				for t := range w.walks {
					t.failed = true // it may have missed an event
				}
				continue
			}
			for t := range w.wds[ev.Wd] {
				if w.walks[t] {
					t.failed = true // it must not arm
				} else {
					t.armed = false
				}
			}
		}
	}
}

func procFD(fd int) string {
	return "/proc/self/fd/" + strconv.Itoa(fd)
}
