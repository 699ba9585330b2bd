package ns

import (
	"bufio"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"

	"tine/internal/atomicfile"

	"golang.org/x/sys/unix"
)

// syncDirtyMax is the most dirty page cache, host-wide, at which
// syncTree writes out a whole file system: below it a syncfs is one
// call that waits on little, above it a syncfs waits for every other
// writer's data too (2.3 GB dirty made a fork into 1 take 3.6 s).
var syncDirtyMax int64 = 32 << 20

// syncWorkers is how many fsyncs syncTree has in flight: a journaled
// file system commits those that wait together at once.
const syncWorkers = 16

// syncTree makes the tree at root durable: every directory's entries
// and every regular file's data and attributes, root's included (ADR
// 0216). Where little is dirty on the host besides what the tree may
// hold itself, it writes out root's file system (syncfs), as cheap as
// one fsync then; otherwise it fsyncs the tree's directories and files,
// so that the sandbox's fork or snapshot does not wait for what other
// sandboxes and the host wrote. The walk (walkLayerDepth) follows no
// link and opens each directory below its parent, so a tree a sandbox is
// changing meanwhile (its own layer) never leads it elsewhere; a file
// gone or turned into something else under it is skipped. A tree deeper
// than the walk goes is written out by syncfs.
func syncTree(ctx context.Context, root string) error {
	if dirty, ok := dirtyBytes(); !ok || dirty <= syncDirtyMax || dirty-newBytes(ctx, root) <= syncDirtyMax {
		return atomicfile.SyncFS(root)
	}
	err := fsyncTree(ctx, root)
	if errors.Is(err, errTooDeep) {
		return atomicfile.SyncFS(root)
	}
	return err
}

// fsyncTree fsyncs every directory and regular file below and at root,
// syncWorkers at a time. It fails with errTooDeep, having synced what it
// reached, where the tree goes deeper than walkLayerDepth does.
func fsyncTree(ctx context.Context, root string) error {
	dir, err := os.OpenFile(root, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	jobs := make(chan *os.File, syncWorkers)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for range syncWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range jobs {
				err := f.Sync()
				f.Close()
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	jobs <- dir
	err = walkLayerDepth(ctx, root, func(dfd int, name string, st *unix.Stat_t, depth int) error {
		typ := st.Mode & unix.S_IFMT
		flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		switch typ {
		case unix.S_IFDIR:
			if depth >= maxLayerDepth {
				return errTooDeep
			}
			flags |= unix.O_DIRECTORY
		case unix.S_IFREG:
			flags |= unix.O_NONBLOCK | unix.O_NOCTTY // never waits, even if swapped for a FIFO
		default:
			return nil // symlinks, devices, FIFOs and sockets: their directory's fsync holds their entry
		}
		fd, err := unix.Openat(dfd, name, flags, 0)
		if err != nil {
			return nil // gone under the walk
		}
		if unix.Fstat(fd, st) != nil || st.Mode&unix.S_IFMT != typ {
			unix.Close(fd) // swapped for something else meanwhile
			return nil
		}
		jobs <- os.NewFile(uintptr(fd), name)
		return nil
	})
	close(jobs)
	wg.Wait()
	return errors.Join(append([]error{err}, errs...)...)
}

// newBytes is the most the tree at root can hold dirty: the bytes of its
// regular files that have one name (a file linked from elsewhere was
// written out where it came from), holes left out.
func newBytes(ctx context.Context, root string) int64 {
	var n int64
	walkLayerAt(ctx, root, func(_ int, _ string, st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1 {
			n += min(st.Size, st.Blocks*512)
		}
		return nil
	})
	return n
}

// dirtyBytes is the host's page cache waiting to be written (Dirty and
// Writeback in /proc/meminfo), and whether it could be read.
func dirtyBytes() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var sum int64
	seen := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, _ := strings.Cut(s.Text(), ":")
		if k != "Dirty" && k != "Writeback" {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, false
		}
		sum += kb << 10
		seen++
	}
	return sum, seen == 2
}
