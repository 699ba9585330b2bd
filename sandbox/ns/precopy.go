package ns

import (
	"context"
	"os"
	"path/filepath"
	"strconv"

	"tine/internal/atomicfile"

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
func precopy(ctx context.Context, upper, pre string, refs ...*layerIndex) (*layerIndex, error) {
	type file struct {
		path string
		st   unix.Stat_t
	}
	var files []file
	var bytes int64
	mem := 0 // the paths held, bounded as an index is
	seen := map[fileID]bool{}
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		names, err := dirNames(dir)
		if err != nil {
			return err
		}
		for _, n := range names {
			p := filepath.Join(dir, n)
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				continue // gone meanwhile: the frozen copy sees what is there
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				if depth < maxLayerDepth {
					if err := walk(p, depth+1); err != nil {
						return err
					}
				}
			case unix.S_IFREG:
				id := fileID{st.Dev, st.Ino}
				if seen[id] || held(refs, &st) || mem+entryBytes(p) > maxIndexBytes {
					continue
				}
				seen[id] = true
				files = append(files, file{p, st})
				bytes += st.Size
				mem += entryBytes(p)
			}
		}
		return nil
	}
	if err := walk(upper, 0); err != nil || bytes < precopyMin {
		return nil, err
	}
	if err := atomicfile.SyncFS(upper); err != nil {
		return nil, err
	}
	if err := os.Mkdir(pre, 0o700); err != nil {
		return nil, err
	}
	x := &layerIndex{root: pre, files: map[fileID]indexed{}}
	start := copyClock()
	for i, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		src, ok, err := openSource(f.path, &f.st, start)
		if err != nil || !ok {
			if src != nil {
				src.Close()
			}
			continue // gone, changed or not settled: copied frozen
		}
		rel := strconv.Itoa(i)
		to := filepath.Join(pre, rel)
		err = copyBytes(src, to)
		src.Close()
		if err == nil {
			err = copyAttrs(f.path, to, &f.st)
		}
		if err != nil {
			return nil, err
		}
		x.add(fileID{f.st.Dev, f.st.Ino}, stampOf(&f.st), rel)
	}
	return x, nil
}

// held reports whether one of refs holds the file st unchanged.
func held(refs []*layerIndex, st *unix.Stat_t) bool {
	for _, x := range refs {
		if x == nil {
			continue
		}
		if e, ok := x.files[fileID{st.Dev, st.Ino}]; ok && e.stamp == stampOf(st) {
			return true
		}
	}
	return false
}
