package cowfs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"

	"tine/chunkstore"
)

// frozenFile is a copy of a file's state, to cut into chunks without
// the branch's lock: the fsync log's files (commitLogged) and the files
// held in memory (flushMemBehind) are stored so while the mount serves.
// Whoever installs the chunks checks first that the file did not change
// since (fd and gen).
type frozenFile struct {
	in     *inode
	fd     *fileData // the file's state when frozen, checked again at install
	gen    uint64
	ovPath string
	mem    []byte   // a copy of the written bytes held in memory, when ovPath is ""
	copy   fileData // refs, offs and written ranges as they were
	size   int64
	out    []fileRef
	err    error
}

// freeze copies a file's state. Caller holds b.mu.
func freeze(in *inode) *frozenFile {
	fd := in.f
	f := &frozenFile{in: in, fd: fd, gen: fd.gen, ovPath: fd.ovPath, size: in.size}
	f.copy.refs = append([]fileRef(nil), fd.refs...)
	f.copy.offs = append([]int64(nil), fd.offs...)
	f.copy.dirty = append([]extent(nil), fd.dirty...)
	if fd.ovPath == "" {
		f.mem = bytes.Clone(fd.mem)
	}
	return f
}

// cut stores the frozen content as chunks (f.out), reading the written
// bytes from the copy of memory or from the overlay file, through a
// descriptor of its own.
func (f *frozenFile) cut(ctx context.Context, st *chunkstore.Store, name string) {
	written := func(buf []byte, pos int64) error {
		m := 0
		if pos < int64(len(f.mem)) {
			m = copy(buf, f.mem[pos:])
		}
		clear(buf[m:]) // past the written bytes: zeros
		return nil
	}
	if f.ovPath != "" {
		ov, err := os.Open(f.ovPath)
		if err != nil {
			f.err = err
			return
		}
		defer ov.Close()
		written = func(buf []byte, pos int64) error {
			m, err := ov.ReadAt(buf, pos)
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			clear(buf[m:]) // past the overlay file's end: zeros
			return nil
		}
	}
	fd := &f.copy
	chunk := func(r fileRef) ([]byte, error) { return getChunk(st, name, r) }
	f.out, f.err = cutFile(ctx, st, name, fd, f.size, func(p []byte, off int64) (int, error) {
		return fd.readAt(p, off, f.size, written, chunk)
	})
}
