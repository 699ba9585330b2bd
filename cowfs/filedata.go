package cowfs

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// extent is a dirty byte range [off, end) of a file.
type extent struct{ off, end int64 }

// maxDirtyExtents bounds the written ranges a file keeps apart: 16 bytes
// of the server's memory each, and a write among them moves the ones
// after it. A write that leaves more stores the file's content, which
// leaves it none (a hostile pattern: one byte written every other byte).
const maxDirtyExtents = 1 << 15

// fileData is a file's content while the branch is live: the committed
// chunk list plus a sparse overlay file holding the bytes written since.
type fileData struct {
	refs    []fileRef
	offs    []int64 // offs[i] is where refs[i] starts; offs[len(refs)] = baseLen
	dirty   []extent
	changed bool          // content differs from id
	gen     uint64        // counts changes of content (write, truncate, punch)
	mem     []byte        // written bytes kept in memory, when ovPath is "" (see memfile.go)
	ov      *os.File      // the overlay file while open (see overlay.go)
	ovPath  string        // the overlay file's path once made
	ovElem  *list.Element // place among the branch's open overlays
}

func (fd *fileData) baseLen() int64 { return fd.offs[len(fd.refs)] }

func (fd *fileData) setRefs(refs []fileRef) {
	fd.refs = refs
	fd.offs = make([]int64, len(refs)+1)
	for i, r := range refs {
		fd.offs[i+1] = fd.offs[i] + r.Size
	}
}

// extentAfter returns the index of the first dirty extent ending after pos.
func (fd *fileData) extentAfter(pos int64) int {
	return sort.Search(len(fd.dirty), func(i int) bool { return fd.dirty[i].end > pos })
}

func (fd *fileData) overlaps(a, e int64) bool {
	i := fd.extentAfter(a)
	return i < len(fd.dirty) && fd.dirty[i].off < e
}

func (fd *fileData) addExtent(a, e int64) {
	if a >= e {
		return
	}
	i := sort.Search(len(fd.dirty), func(i int) bool { return fd.dirty[i].end >= a })
	j := i
	for j < len(fd.dirty) && fd.dirty[j].off <= e {
		a = min(a, fd.dirty[j].off)
		e = max(e, fd.dirty[j].end)
		j++
	}
	fd.dirty = append(fd.dirty[:i], append([]extent{{a, e}}, fd.dirty[j:]...)...)
}

// cutExtents forgets the written bytes in [a, e).
func (fd *fileData) cutExtents(a, e int64) {
	var out []extent
	for _, x := range fd.dirty {
		if x.end <= a || x.off >= e {
			out = append(out, x)
			continue
		}
		if x.off < a {
			out = append(out, extent{x.off, a})
		}
		if x.end > e {
			out = append(out, extent{e, x.end})
		}
	}
	fd.dirty = out
}

func (fd *fileData) clipExtents(n int64) {
	i := fd.extentAfter(n)
	if i < len(fd.dirty) && fd.dirty[i].off < n {
		fd.dirty[i].end = n
		i++
	}
	fd.dirty = fd.dirty[:i]
}

// fileOf loads a file's chunk list on first use.
func (b *branch) fileOf(in *inode) (*fileData, error) {
	if in.f != nil {
		return in.f, nil
	}
	refs, size, err := getFile(b.fs.store, in.id)
	if err != nil {
		return nil, fmt.Errorf("branch %q: %w", b.name, err)
	}
	if size != in.size {
		return nil, fmt.Errorf("branch %q: file object %s: %w: holds %d bytes, entry says %d", b.name, in.id, errCorrupt, size, in.size)
	}
	fd := &fileData{}
	fd.setRefs(refs)
	in.f = fd
	return fd, nil
}

// chunk returns a chunk's bytes (a small cache keeps the recent ones).
func (b *branch) chunk(r fileRef) ([]byte, error) {
	if r.ID.IsZero() {
		return nil, nil
	}
	if d, ok := b.chunkCache[r.ID]; ok {
		return d, nil
	}
	d, err := getChunk(b.fs.store, b.name, r)
	if err != nil {
		return nil, err
	}
	const keep = 16
	if len(b.chunkOrder) >= keep {
		delete(b.chunkCache, b.chunkOrder[0])
		b.chunkOrder = b.chunkOrder[1:]
	}
	b.chunkCache[r.ID] = d
	b.chunkOrder = append(b.chunkOrder, r.ID)
	return d, nil
}

// getChunk reads a chunk of a file of branch name from the store and
// checks its size.
func getChunk(st *chunkstore.Store, name string, r fileRef) ([]byte, error) {
	if r.ID.IsZero() {
		return nil, nil
	}
	d, err := st.Get(r.ID)
	if err != nil {
		return nil, fmt.Errorf("branch %q: read chunk %s: %w", name, r.ID, err)
	}
	if int64(len(d)) != r.Size {
		return nil, fmt.Errorf("branch %q: chunk %s: %w: %d bytes, ref says %d", name, r.ID, errCorrupt, len(d), r.Size)
	}
	return d, nil
}

// readAt reads the file's current content. Caller holds b.mu.
func (b *branch) readAt(in *inode, p []byte, off int64) (int, error) {
	fd, err := b.fileOf(in)
	if err != nil {
		return 0, err
	}
	return fd.readAt(p, off, in.size, func(buf []byte, pos int64) error { return b.ovRead(in, buf, pos) }, b.chunk)
}

// readAt reads the content of a file of size bytes at off: its written
// ranges with written, the rest from its committed chunks, got with
// chunk (nil for a hole).
func (fd *fileData) readAt(p []byte, off, size int64, written func(buf []byte, pos int64) error, chunk func(fileRef) ([]byte, error)) (int, error) {
	if off >= size {
		return 0, io.EOF
	}
	end := min(off+int64(len(p)), size)
	pos := off
	for pos < end {
		buf := p[pos-off : end-off]
		i := fd.extentAfter(pos)
		if i < len(fd.dirty) && fd.dirty[i].off <= pos {
			n := min(end, fd.dirty[i].end) - pos
			if err := written(buf[:n], pos); err != nil {
				return int(pos - off), err
			}
			pos += n
			continue
		}
		next := end
		if i < len(fd.dirty) {
			next = min(next, fd.dirty[i].off)
		}
		if err := fd.readBase(buf[:next-pos], pos, chunk); err != nil {
			return int(pos - off), err
		}
		pos = next
	}
	n := int(end - off)
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// readBase reads the committed chunks at pos (zeros past them).
func (fd *fileData) readBase(buf []byte, pos int64, chunk func(fileRef) ([]byte, error)) error {
	for len(buf) > 0 {
		if pos >= fd.baseLen() {
			clear(buf)
			return nil
		}
		j := sort.Search(len(fd.refs), func(i int) bool { return fd.offs[i+1] > pos })
		d, err := chunk(fd.refs[j])
		if err != nil {
			return err
		}
		in := pos - fd.offs[j]
		n := min(int64(len(buf)), int64(fd.refs[j].Size)-in)
		if d == nil {
			clear(buf[:n])
		} else {
			copy(buf[:n], d[in:in+n])
		}
		buf = buf[n:]
		pos += n
	}
	return nil
}

// write writes p at off, charging len(p) to the quota. Caller holds b.mu.
func (b *branch) write(in *inode, p []byte, off int64) (int, error) {
	if off < 0 || off > maxFileSize-int64(len(p)) {
		return 0, limitErr(syscall.EFBIG, "write of %d bytes at %d passes the largest file size %d", len(p), off, int64(maxFileSize))
	}
	if err := b.charge(int64(len(p))); err != nil {
		return 0, err
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return 0, err
	}
	n, err := b.ovWrite(in, p, off)
	if n > 0 {
		fd.addExtent(off, off+int64(n))
		fd.changed = true
		fd.gen++
		if off+int64(n) > in.size {
			in.size = off + int64(n)
		}
		t := nowNs()
		in.mtime, in.ctime = t, t
		if terr := b.touch(in); err == nil {
			err = terr
		}
		if len(fd.dirty) > maxDirtyExtents {
			// Stored, the file keeps no written ranges. A failure leaves
			// it as it was; the next commit reports it.
			b.commitFile(context.Background(), in)
		}
	}
	if err != nil {
		return n, fmt.Errorf("branch %q: write inode %d overlay %s: %w", b.name, in.ino, fd.ovPath, err)
	}
	return n, nil
}

// toOverlay copies [a, e) of the file's current content into its overlay
// and marks it written (a few chunks at most: the callers copy the part
// of one chunk that stays when the rest of it goes). Caller holds b.mu.
func (b *branch) toOverlay(in *inode, a, e int64) error {
	if a >= e {
		return nil
	}
	buf := make([]byte, e-a)
	if _, err := b.readAt(in, buf, a); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if _, err := b.ovWrite(in, buf, a); err != nil {
		return fmt.Errorf("branch %q: write inode %d overlay %s: %w", b.name, in.ino, in.f.ovPath, err)
	}
	in.f.addExtent(a, e)
	return nil
}

// truncate sets a file's size, and its mtime and ctime to now even when
// the size stays; growth is charged to the quota as if written, though it
// stores nothing (a hole). Caller holds b.mu.
func (b *branch) truncate(in *inode, n int64) error {
	if n < 0 {
		return limitErr(syscall.EFBIG, "size %d out of range", n)
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return err
	}
	if n == in.size {
		// Nothing to cut or grow, but a truncation (O_TRUNC, ftruncate)
		// marks the file changed all the same, as Linux does: make and its
		// kind compare these times.
		t := nowNs()
		in.mtime, in.ctime = t, t
		return b.touch(in)
	}
	if n < in.size && b.needsLog(fd) {
		if _, err := b.commitRefs(context.Background(), false); err != nil {
			return err
		}
	}
	if n > in.size {
		if err := b.charge(n - in.size); err != nil {
			return err
		}
	} else {
		if n < fd.baseLen() {
			// Cut the base at a chunk boundary; the kept part of the cut
			// chunk moves into the overlay.
			j := sort.Search(len(fd.refs), func(i int) bool { return fd.offs[i+1] > n })
			if !fd.refs[j].ID.IsZero() {
				if err := b.toOverlay(in, fd.offs[j], n); err != nil {
					return err
				}
			}
			fd.setRefs(fd.refs[:j:j])
		}
		fd.clipExtents(n)
		fd.memTruncate(n)
		if fd.ovPath != "" {
			ov, err := b.overlay(in)
			if err != nil {
				return err
			}
			if err := ov.Truncate(n); err != nil {
				return fmt.Errorf("branch %q: truncate overlay %s: %w", b.name, fd.ovPath, err)
			}
		}
	}
	in.size = n
	fd.changed = true
	fd.gen++
	t := nowNs()
	in.mtime, in.ctime = t, t
	return b.touch(in)
}

// punch makes [off, end) of the file a hole without writing zeros: stored
// chunks it covers become holes (the parts of the edge chunks outside it
// move to the overlay), written bytes in it are forgotten. It is never
// refused by the quota and charges nothing. Caller holds b.mu.
func (b *branch) punch(in *inode, off, end int64) error {
	end = min(end, in.size)
	if off < 0 || off >= end {
		return nil
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return err
	}
	if b.needsLog(fd) {
		if _, err := b.commitRefs(context.Background(), false); err != nil {
			return err
		}
	}
	if off < fd.baseLen() {
		i := sort.Search(len(fd.refs), func(k int) bool { return fd.offs[k+1] > off })
		j := sort.Search(len(fd.refs), func(k int) bool { return fd.offs[k] >= end })
		out := append([]fileRef(nil), fd.refs[:i]...)
		for k := i; k < j; k++ {
			r := fd.refs[k]
			if !r.ID.IsZero() {
				if err := b.toOverlay(in, fd.offs[k], off); err != nil {
					return err
				}
				if err := b.toOverlay(in, end, fd.offs[k+1]); err != nil {
					return err
				}
			}
			out = appendHole(out, r.Size)
		}
		fd.setRefs(append(out, fd.refs[j:]...))
	}
	fd.cutExtents(off, end)
	fd.memPunch(off, end)
	if fd.ovPath != "" {
		// Give the overlay's disk space back; the bytes are dead either way.
		if ov, err := b.overlay(in); err == nil {
			unix.Fallocate(int(ov.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, end-off)
		}
	}
	fd.changed = true
	fd.gen++
	t := nowNs()
	in.mtime, in.ctime = t, t
	return b.touch(in)
}
