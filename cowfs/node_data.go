package cowfs

import (
	"context"
	"sort"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// readTestHook, when set (by tests), runs as a READ is served, with the
// branch's name.
var readTestHook atomic.Pointer[func(branch string)]

func (n *node) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	b := n.b
	if hook := readTestHook.Load(); hook != nil {
		(*hook)(b.name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	if h := handleOf(fh); h != nil {
		in = h.in
	}
	m, err := b.readAt(in, dest, off)
	if err != nil && m == 0 && off < in.size {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:m]), 0
}

func (n *node) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	if h := handleOf(fh); h != nil {
		in = h.in
	}
	w, err := b.write(in, data, off)
	if w > 0 {
		n.paged = false
	}
	if err != nil && w == 0 {
		return 0, toErrno(err)
	}
	return uint32(w), 0
}

// fsyncTestHook, when set (by tests), runs as an fsync is served.
var fsyncTestHook atomic.Pointer[func()]

func (n *node) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	if hook := fsyncTestHook.Load(); hook != nil {
		(*hook)()
	}
	if err := n.b.sync(context.Background()); err != nil {
		return syscall.EIO
	}
	return 0
}

func (n *node) Allocate(ctx context.Context, fh gofs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	if in.typ != TypeFile {
		return syscall.ENODEV
	}
	if off > maxFileSize || size > maxFileSize-off {
		return syscall.EFBIG
	}
	end := int64(off + size)
	n.paged = false // the kernel drops a punched range's pages
	switch mode {
	case 0:
		if end > in.size {
			return toErrno(b.truncate(in, end))
		}
		return 0
	case unix.FALLOC_FL_KEEP_SIZE:
		return 0
	case unix.FALLOC_FL_KEEP_SIZE | unix.FALLOC_FL_PUNCH_HOLE:
		return toErrno(b.punch(in, int64(off), end))
	}
	return syscall.EOPNOTSUPP
}

func (n *node) Lseek(ctx context.Context, fh gofs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	if h := handleOf(fh); h != nil {
		in = h.in
	}
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return 0, syscall.EINVAL
	}
	if in.typ != TypeFile || int64(off) >= in.size {
		return 0, syscall.ENXIO
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return 0, syscall.EIO
	}
	pos, ok := fd.seek(int64(off), in.size, whence == unix.SEEK_DATA)
	if !ok {
		return 0, syscall.ENXIO
	}
	return uint64(pos), 0
}

// isData reports whether the byte at pos holds data (written, or inside a
// stored chunk) and where that state ends.
func (fd *fileData) isData(pos, size int64) (bool, int64) {
	end := size
	i := fd.extentAfter(pos)
	if i < len(fd.dirty) {
		if fd.dirty[i].off <= pos {
			return true, fd.dirty[i].end
		}
		end = fd.dirty[i].off // a written range starts here at the latest
	}
	if pos < fd.baseLen() {
		j := sort.Search(len(fd.refs), func(k int) bool { return fd.offs[k+1] > pos })
		if !fd.refs[j].ID.IsZero() {
			return true, fd.offs[j+1]
		}
		return false, min(end, fd.offs[j+1])
	}
	return false, end
}

// seek finds the next data (or hole) at or after pos; the end of the file
// counts as a hole.
func (fd *fileData) seek(pos, size int64, data bool) (int64, bool) {
	for pos < size {
		d, end := fd.isData(pos, size)
		if d == data {
			return pos, true
		}
		pos = end
	}
	if data {
		return 0, false
	}
	return size, true
}

// Statfs reports the space the branch can still take: the free space of
// the disk holding the store, and within it the quota's remainder when
// the branch has a quota.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	b := n.b
	const bs = 4096
	total, free := uint64(1)<<50, uint64(1)<<50
	var st unix.Statfs_t
	if unix.Statfs(b.fs.root, &st) == nil {
		total, free = st.Blocks*uint64(st.Bsize), st.Bavail*uint64(st.Bsize)
	}
	b.mu.Lock()
	q, used := b.meta.QuotaBytes, b.meta.UsedBytes
	b.mu.Unlock()
	if q > 0 {
		total = uint64(q)
		free = min(free, uint64(max(q-used, 0)))
	}
	out.Bsize, out.Frsize = bs, bs
	out.Blocks, out.Bfree, out.Bavail = total/bs, free/bs, free/bs
	out.Files, out.Ffree = 1<<40, 1<<40
	out.NameLen = 255
	return 0
}
