package cowfs

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A process that writes a file through a shared mapping (mmap with
// MAP_SHARED and PROT_WRITE) changes pages in the kernel's page cache;
// the kernel sends them to cowfs as WRITE requests later: at msync,
// fsync or munmap, or when its writeback comes round (seconds). Until
// then the branch does not hold those bytes, so a snapshot or a head
// taken then would miss a write the process already made, and a fork
// would not see it. flushMapped has the kernel send them first.
//
// Such a mapping needs its file open for writing (a mapping holds its
// file open, and the kernel writes a mapping's dirty pages back when it
// is unmapped), so only the files with a writable handle need it
// (branch.writing). syncfs(2) is not enough: it starts the writes but,
// on a FUSE mount other than virtiofs, does not wait for their answers.
// An fsync does (the kernel waits for the file's writes under way before
// it sends FSYNC), so flushMapped opens each such file through the mount
// and fdatasyncs it; cowfs answers the first FSYNC with a commit, the
// others find little to do. A file open for writing but unreachable by
// name (unlinked, or too deep for a path) is in no snapshot anyway or
// is skipped.

// flushMapped has the kernel send the pages of b's files open for
// writing that mappings dirtied. Call it without b.mu: the writes and
// fsyncs it causes are served by b. It reports the first file it could
// not flush.
func (b *branch) flushMapped() error {
	b.mu.Lock()
	var paths []string
	for in := range b.writing {
		if p, ok := b.pathOf(in); ok {
			paths = append(paths, filepath.Join(b.mountDir, p))
		}
	}
	b.mu.Unlock()
	for _, p := range paths {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // renamed or removed since: found by its new name next time, or gone
		}
		err = unix.Fdatasync(fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("branch %q: flush the mapped writes of %s: %w", b.name, p, err)
		}
	}
	return nil
}

// pathOf returns a path of in from the branch's root (through any of its
// names), if it has one under the kernel's path length limit. Caller
// holds b.mu.
func (b *branch) pathOf(in *inode) (string, bool) {
	var names []string
	n := 0
	for c := in; c != b.root; {
		var p *inode
		for q := range c.parents {
			p = q
			break
		}
		if p == nil {
			return "", false
		}
		name := ""
		for k, v := range p.children {
			if v == c {
				name = k
				break
			}
		}
		if name == "" {
			return "", false
		}
		if n += len(name) + 1; n >= unix.PathMax {
			return "", false
		}
		names = append(names, name)
		c = p
	}
	slices.Reverse(names)
	return strings.Join(names, "/"), true
}
