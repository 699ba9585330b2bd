package cowfs

import (
	"errors"
	"fmt"
	"io"
)

// A file whose written bytes all lie in its first memFileMax bytes keeps
// them in memory (fileData.mem) instead of an overlay file on the host
// disk: an overlay file costs a host create, write and, later, unlink,
// which is most of what an untar, a create or an `rm -rf` of fresh files
// waits for. A write past memFileMax, or one that the branch's or the
// FS's budget cannot hold, moves the bytes into an overlay file (spill).
// A commit stores them in the chunk store and frees the memory, as it
// removes an overlay file. They are as durable as an overlay file's
// bytes: scratch until a commit (ADR 0011), lost with the process.
const memFileMax = 64 << 10

// Default budgets for in-memory file bytes (see Options).
const (
	DefaultMemBytes       = 256 << 20
	DefaultBranchMemBytes = 64 << 20
)

// memStep is the granularity of in-memory buffers.
const memStep = 1 << 10

// memBudget returns the branch's and the FS's budgets for in-memory file
// bytes (zero: none kept in memory).
func (f *FS) memBudget() (branch, fs int64) { return f.branchMemBytes, f.memBytes }

// memInUse returns the bytes of in-memory file data held by every branch
// of the FS.
func (f *FS) memInUse() int64 { return f.memUsed.Load() }

// memGrow makes fd.mem at least end bytes long, charging what it
// allocates to the budgets; it reports false, changing nothing, when
// they cannot hold it. Bytes of fd.mem past its length are always zero.
// Caller holds b.mu.
func (b *branch) memGrow(in *inode, end int64) bool {
	fd := in.f
	if end <= int64(len(fd.mem)) {
		return true
	}
	if end <= int64(cap(fd.mem)) {
		fd.mem = fd.mem[:end]
		return true
	}
	old := int64(cap(fd.mem))
	c := (end + memStep - 1) / memStep * memStep
	if c < 2*old {
		c = 2 * old
	}
	c = min(c, memFileMax)
	delta := c - old
	bmax, fmax := b.fs.memBudget()
	if b.memUsed+delta > bmax {
		return false
	}
	if b.fs.memUsed.Add(delta) > fmax {
		b.fs.memUsed.Add(-delta)
		return false
	}
	b.memUsed += delta
	m := make([]byte, end, c)
	copy(m, fd.mem)
	fd.mem = m
	b.memFiles[fd] = in
	return true
}

// memFree frees a file's in-memory bytes. Caller holds b.mu.
func (b *branch) memFree(fd *fileData) {
	if fd.mem == nil {
		return
	}
	c := int64(cap(fd.mem))
	b.memUsed -= c
	b.fs.memUsed.Add(-c)
	fd.mem = nil
	delete(b.memFiles, fd)
}

// ovWrite writes p at off into the file's written bytes: in memory while
// they fit (see memFileMax), else in its overlay file. It does not mark
// the range written. Caller holds b.mu.
func (b *branch) ovWrite(in *inode, p []byte, off int64) (int, error) {
	fd := in.f
	if len(p) == 0 {
		return 0, nil
	}
	if fd.ovPath == "" {
		end := off + int64(len(p))
		if end <= memFileMax {
			if b.memGrow(in, end) {
				copy(fd.mem[off:end], p)
				return len(p), nil
			}
			b.flushMemBehind()
		}
		if err := b.spill(in); err != nil {
			return 0, err
		}
	}
	ov, err := b.overlay(in)
	if err != nil {
		return 0, err
	}
	return ov.WriteAt(p, off)
}

// ovRead reads written bytes at off into p (zeros past what was written).
// Caller holds b.mu.
func (b *branch) ovRead(in *inode, p []byte, off int64) error {
	fd := in.f
	if fd.ovPath == "" {
		m := 0
		if off < int64(len(fd.mem)) {
			m = copy(p, fd.mem[off:])
		}
		clear(p[m:])
		return nil
	}
	ov, err := b.overlay(in)
	if err != nil {
		return err
	}
	m, err := ov.ReadAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("branch %q: read overlay %s: %w", b.name, fd.ovPath, err)
	}
	clear(p[m:]) // past the overlay file's end: zeros
	return nil
}

// spill moves a file's in-memory bytes into its overlay file. Caller
// holds b.mu.
func (b *branch) spill(in *inode) error {
	fd := in.f
	if fd.mem == nil {
		return nil
	}
	ov, err := b.overlay(in)
	if err != nil {
		return err
	}
	for _, x := range fd.dirty {
		a, e := x.off, min(x.end, int64(len(fd.mem)))
		if a >= e {
			continue
		}
		if _, err := ov.WriteAt(fd.mem[a:e], a); err != nil {
			return fmt.Errorf("branch %q: write inode %d overlay %s: %w", b.name, in.ino, fd.ovPath, err)
		}
	}
	b.memFree(fd)
	return nil
}

// memTruncate cuts a file's in-memory bytes to n. Caller holds b.mu.
func (fd *fileData) memTruncate(n int64) {
	if n < int64(len(fd.mem)) {
		clear(fd.mem[n:])
		fd.mem = fd.mem[:n]
	}
}

// memPunch zeroes [off, end) of a file's in-memory bytes.
func (fd *fileData) memPunch(off, end int64) {
	end = min(end, int64(len(fd.mem)))
	if off < end {
		clear(fd.mem[off:end])
	}
}
