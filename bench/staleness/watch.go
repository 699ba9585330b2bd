package main

import (
	"errors"
	"io/fs"
	"path/filepath"
	"sort"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchMask is what a staleness watch needs to hear: content, metadata,
// names and directories coming and going.
const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW

// watcher keeps an inotify watch on every directory of a tree and the
// set of paths changed since it started: the alternative to a metadata
// scan that a daemon could keep while it runs.
type watcher struct {
	fd   int
	root string

	mu       sync.Mutex
	dirs     map[int32]string // watch descriptor → relative directory
	changed  map[string]struct{}
	overflow bool
	events   int
	// seen is told each path as it is recorded (latency measurement).
	seen chan string
}

// newWatcher walks root and watches every directory in it.
func newWatcher(root string) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	w := &watcher{fd: fd, root: root, dirs: map[int32]string{}, changed: map[string]struct{}{}}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return w.add(p)
	})
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	go w.read()
	return w, nil
}

func (w *watcher) add(p string) error {
	wd, err := unix.InotifyAddWatch(w.fd, p, watchMask)
	if err != nil {
		return err
	}
	rel, _ := filepath.Rel(w.root, p)
	w.mu.Lock()
	w.dirs[int32(wd)] = rel
	w.mu.Unlock()
	return nil
}

// read records events until the descriptor is closed.
func (w *watcher) read() {
	buf := make([]byte, 256<<10)
	for {
		n, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				b := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				for i, c := range b {
					if c == 0 {
						b = b[:i]
						break
					}
				}
				name = string(b)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			w.note(ev, name)
		}
	}
}

func (w *watcher) note(ev *unix.InotifyEvent, name string) {
	w.mu.Lock()
	w.events++
	if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
		w.overflow = true
		w.mu.Unlock()
		return
	}
	dir, ok := w.dirs[ev.Wd]
	if ev.Mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, ev.Wd)
	}
	w.mu.Unlock()
	if !ok {
		return
	}
	p := filepath.Join(dir, name)
	if ev.Mask&unix.IN_ISDIR != 0 && ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		// A new directory: watch it (and, in a product, scan what it
		// gained before the watch was added).
		w.add(filepath.Join(w.root, p))
	}
	w.mu.Lock()
	w.changed[p] = struct{}{}
	seen := w.seen
	w.mu.Unlock()
	if seen != nil {
		select {
		case seen <- p:
		default:
		}
	}
}

// what answers "what changed": the sorted changed paths, and whether the
// queue overflowed (then only a scan can tell).
func (w *watcher) what() ([]string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.changed))
	for p := range w.changed {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, w.overflow
}

// reset forgets what changed (as after a promotion).
func (w *watcher) reset() {
	w.mu.Lock()
	w.changed, w.overflow, w.events = map[string]struct{}{}, false, 0
	w.mu.Unlock()
}

// waitFor waits until path p is recorded and returns how long that took.
func (w *watcher) waitFor(p string, start time.Time, timeout time.Duration) (time.Duration, bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case got := <-w.seen:
			if got == p {
				return time.Since(start), true
			}
		case <-t.C:
			return 0, false
		}
	}
}

func (w *watcher) close() { unix.Close(w.fd) }

// kernelMarks returns the inotify_inode_mark slab's bytes in use (root
// only; 0 when the slab is not listed on its own).
func kernelMarks() int64 {
	return slabBytes("inotify_inode_mark")
}
