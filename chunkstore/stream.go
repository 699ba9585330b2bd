package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
)

// PutStream cuts r into content-defined chunks (FastCDC with the store's
// sizes), stores them, and returns the chunk list. Runs of zeros that fill
// a whole chunk come back as zero-ID refs and are not stored. Hashing and
// compression run on Options.Workers goroutines.
func (s *Store) PutStream(ctx context.Context, r io.Reader) ([]Ref, error) {
	p := s.params
	return s.putChunks(ctx, r, p.Max, func(b []byte) int { return p.Cut(b) })
}

// PutFixed cuts r into chunks of size bytes (the last may be shorter),
// stores them, and returns the chunk list. All-zero chunks come back as
// zero-ID refs and are not stored. Use it for block and memory images
// (size 4096 for pages).
func (s *Store) PutFixed(ctx context.Context, r io.Reader, size int) ([]Ref, error) {
	if size <= 0 || size > maxObject {
		return nil, fmt.Errorf("chunkstore: put fixed: bad chunk size %d", size)
	}
	return s.putChunks(ctx, r, size, func(b []byte) int { return min(len(b), size) })
}

type chunkJob struct {
	seq  int
	data []byte
	buf  *[]byte
}

type chunkResult struct {
	seq int
	ref Ref
	err error
}

// putChunks reads r, cuts it with cut (which sees at least maxLen bytes
// unless the stream ends) and stores the chunks in parallel.
func (s *Store) putChunks(ctx context.Context, r io.Reader, maxLen int, cut func([]byte) int) ([]Ref, error) {
	// Small streams (most files) are cut and stored in this goroutine.
	bp := s.smallBufs.Get().(*[]byte)
	defer s.smallBufs.Put(bp)
	head := (*bp)[:smallStream]
	n, err := io.ReadFull(r, head)
	head = head[:n]
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return s.putSmall(ctx, head, cut)
	}
	if err != nil {
		return nil, fmt.Errorf("chunkstore: read stream: %w", err)
	}
	return s.putParallel(ctx, io.MultiReader(bytes.NewReader(head), r), maxLen, cut)
}

// smallStream is the size up to which a stream is stored without
// spawning workers.
const smallStream = 1 << 20

func (s *Store) putSmall(ctx context.Context, data []byte, cut func([]byte) int) ([]Ref, error) {
	var refs []Ref
	var scratch []byte
	for len(data) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := cut(data)
		ref, err := s.putChunk(data[:n], &scratch)
		if err != nil {
			return nil, err
		}
		refs = append(refs, ref)
		data = data[n:]
	}
	var total uint64
	for _, r := range refs {
		total += uint64(r.Size)
	}
	s.addLogical(total)
	return refs, nil
}

func (s *Store) putParallel(ctx context.Context, r io.Reader, maxLen int, cut func([]byte) int) ([]Ref, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	workers := s.opts.Workers
	jobs := make(chan chunkJob, 2*workers)
	results := make(chan chunkResult, 4*workers)
	pool := sync.Pool{New: func() any { b := make([]byte, 0, maxLen); return &b }}

	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var scratch []byte
			for j := range jobs {
				ref, err := s.putChunk(j.data, &scratch)
				pool.Put(j.buf)
				results <- chunkResult{seq: j.seq, ref: ref, err: err}
			}
		}()
	}
	// Collect results in order of sequence numbers.
	var refs []Ref
	var firstErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for res := range results {
			if res.err != nil && firstErr == nil {
				firstErr = res.err
				cancel()
			}
			for len(refs) <= res.seq {
				refs = append(refs, Ref{})
			}
			refs[res.seq] = res.ref
		}
	}()

	readErr := s.cutStream(ctx, r, maxLen, cut, func(seq int, chunk []byte) bool {
		bp := pool.Get().(*[]byte)
		b := append((*bp)[:0], chunk...)
		*bp = b
		select {
		case jobs <- chunkJob{seq: seq, data: b, buf: bp}:
			return true
		case <-ctx.Done():
			return false
		}
	})
	close(jobs)
	wg.Wait()
	close(results)
	<-done
	if firstErr != nil {
		return nil, firstErr
	}
	if readErr != nil {
		return nil, readErr
	}
	var total uint64
	for _, r := range refs {
		total += uint64(r.Size)
	}
	s.addLogical(total)
	return refs, nil
}

// putChunk stores one chunk of a stream.
func (s *Store) putChunk(data []byte, scratch *[]byte) (Ref, error) {
	ref := Ref{Size: uint32(len(data))}
	if isZero(data) {
		return ref, nil
	}
	ref.ID = Sum(data)
	if _, ok := s.lookup(ref.ID); ok {
		return ref, nil
	}
	if cap(*scratch) < len(data) {
		*scratch = make([]byte, 0, len(data)+len(data)/8+64)
	}
	p := s.prepare(ref.ID, kindBlob, data, *scratch)
	return ref, s.add(p)
}

// cutStream reads r in large blocks and calls emit for each chunk.
func (s *Store) cutStream(ctx context.Context, r io.Reader, maxLen int, cut func([]byte) int, emit func(seq int, chunk []byte) bool) error {
	bufSize := max(8<<20, 2*maxLen)
	buf := make([]byte, bufSize)
	start, end := 0, 0
	eof := false
	seq := 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !eof && end-start < maxLen {
			copy(buf, buf[start:end])
			end -= start
			start = 0
			for !eof && end < len(buf) {
				n, err := r.Read(buf[end:])
				end += n
				if errors.Is(err, io.EOF) {
					eof = true
				} else if err != nil {
					return fmt.Errorf("chunkstore: read stream: %w", err)
				} else if n == 0 {
					continue
				}
			}
		}
		if start == end {
			return nil
		}
		n := cut(buf[start:end])
		if n <= 0 {
			n = end - start
		}
		if !emit(seq, buf[start:start+n]) {
			return ctx.Err()
		}
		seq++
		start += n
	}
}

// Reader reads the bytes a chunk list describes. It implements io.Reader,
// io.ReaderAt and io.Seeker. ReadAt is safe for concurrent use; Read and
// Seek share an offset and are not.
type Reader struct {
	s    *Store
	refs []Ref
	offs []int64 // offs[i] = start of refs[i]; offs[len(refs)] = size
	pos  int64
}

// NewReader returns a Reader over refs.
func (s *Store) NewReader(refs []Ref) *Reader {
	offs := make([]int64, len(refs)+1)
	for i, r := range refs {
		offs[i+1] = offs[i] + int64(r.Size)
	}
	return &Reader{s: s, refs: refs, offs: offs}
}

// Size returns the total length of the chunk list.
func (r *Reader) Size() int64 { return r.offs[len(r.refs)] }

// ReadAt reads len(p) bytes at offset off.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("chunkstore: read at negative offset %d", off)
	}
	size := r.Size()
	if off >= size {
		return 0, io.EOF
	}
	i := sort.Search(len(r.refs), func(i int) bool { return r.offs[i+1] > off }) // chunk holding off
	n := 0
	for n < len(p) && i < len(r.refs) {
		ref := r.refs[i]
		in := off - r.offs[i]
		want := min(int64(len(p)-n), int64(ref.Size)-in)
		if ref.ID.IsZero() {
			clear(p[n : n+int(want)])
		} else {
			data, err := r.s.getShared(ref.ID)
			if err != nil {
				return n, err
			}
			if len(data) != int(ref.Size) {
				return n, fmt.Errorf("chunkstore: chunk %s is %d bytes, the chunk list says %d: %w", ref.ID, len(data), ref.Size, ErrCorrupt)
			}
			copy(p[n:n+int(want)], data[in:])
		}
		n += int(want)
		off += want
		i++
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Read reads from the current offset.
func (r *Reader) Read(p []byte) (int, error) {
	n, err := r.ReadAt(p, r.pos)
	r.pos += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Seek sets the offset for the next Read.
func (r *Reader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.Size()
	default:
		return r.pos, fmt.Errorf("chunkstore: seek: bad whence %d", whence)
	}
	if offset < 0 {
		return r.pos, fmt.Errorf("chunkstore: seek to negative offset %d", offset)
	}
	r.pos = offset
	return offset, nil
}

// getShared is Get without the copy: the result must not be modified.
func (s *Store) getShared(id ID) ([]byte, error) {
	if b, ok := s.cache.get(id); ok {
		return b, nil
	}
	b, _, err := s.read(id)
	if err != nil {
		return nil, err
	}
	s.cache.put(id, b)
	return b, nil
}
