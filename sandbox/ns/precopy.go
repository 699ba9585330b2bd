package ns

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// precopyMin is the fewest bytes to copy that make a snapshot copy them
// before its freeze: below it a walk, a syncfs and a second pass cost
// more than copying them frozen.
const precopyMin = 1 << 20

// precopy copies, with the sandbox still running, the files of its own
// layer upper that no index in refs holds unchanged, into pre: one file
// per inode, named by a number, with its attributes. It returns their
// index, which the frozen copy links from (ADR 0207); a file that
// changes in between shows a new stamp there and is copied frozen. The
// layer's file system is written out first, so that the files are
// settled (no dirty page) when read. It returns nil, copying nothing,
// when those files come to less than precopyMin bytes.
//
// The sandbox runs meanwhile and may swap any directory of its layer
// for a symlink: the layer is walked and read through descriptors, each
// opened below the last without following a link, and a file that
// fails anywhere is left to the frozen copy.
func precopy(ctx context.Context, upper, pre string, refs ...*layerIndex) (*layerIndex, error) {
	var bytes int64
	err := walkLayerAt(ctx, upper, func(_ int, _ string, st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT == unix.S_IFREG && !held(refs, st) {
			bytes += min(st.Size, st.Blocks*512) // holes are not copied
		}
		return nil
	})
	if err != nil || bytes < precopyMin {
		return nil, err
	}
	if err := syncTree(ctx, upper); err != nil {
		return nil, err
	}
	if err := os.Mkdir(pre, 0o700); err != nil {
		return nil, err
	}
	x := &layerIndex{root: pre, files: map[fileID]indexed{}}
	start := copyClock()
	err = walkLayerAt(ctx, upper, func(dfd int, name string, st *unix.Stat_t) error {
		id := fileID{st.Dev, st.Ino}
		if _, ok := x.files[id]; ok || st.Mode&unix.S_IFMT != unix.S_IFREG || held(refs, st) {
			return nil
		}
		rel := strconv.Itoa(len(x.files))
		if entryBytes(rel)+x.bytes > maxIndexBytes {
			return nil
		}
		to := filepath.Join(pre, rel)
		if precopyFile(dfd, name, st, start, to) {
			x.add(id, stampOf(st), rel)
		} else {
			os.Remove(to)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return x, nil
}

// precopyFile copies the file name in directory dfd (stat st) to to,
// with its attributes, and reports whether it did and the file was
// settled (see settledAs) as it was read.
func precopyFile(dfd int, name string, st *unix.Stat_t, start time.Time, to string) bool {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	src := os.NewFile(uintptr(fd), name)
	defer src.Close()
	if !settledAs(src, st, start) {
		return false
	}
	return copyBytes(src, to) == nil &&
		setAttrs(to, st, func() error { return copyXattrsFd(fd, to) }) == nil
}

// held reports whether one of refs holds the file st unchanged.
func held(refs []*layerIndex, st *unix.Stat_t) bool {
	for _, x := range refs {
		if _, ok := x.holds(st); ok {
			return true
		}
	}
	return false
}
