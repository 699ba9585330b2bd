package chunkstore

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"

	"tine/chunkstore/internal/cdc"
)

// Options configure a Store. The zero value selects the defaults.
type Options struct {
	// MinChunk, AvgChunk and MaxChunk are the FastCDC sizes for PutStream
	// (default 16, 64 and 256 KiB).
	MinChunk, AvgChunk, MaxChunk int
	// PackSize is the size at which a pack is sealed and a new one begun
	// (default 32 MiB).
	PackSize int64
	// Level is the zstd level: 1 fastest, 2 default, 3 better, 4 best
	// (default 2). Negative disables compression.
	Level int
	// Workers bounds the goroutines that hash and compress in PutStream and
	// PutFixed (default GOMAXPROCS).
	Workers int
	// CacheBytes bounds the cache of decompressed chunks (default 16 MiB;
	// negative disables it).
	CacheBytes int64
	// GCGrace protects recent objects from GC: objects put, or found
	// already stored by Put, PutNode or Has, within GCGrace before a GC
	// begins (or while it runs) are kept, with what they link to. It gives
	// callers time to link new objects from a node or ref. Default 10
	// minutes; negative means no grace (only objects touched during the GC
	// are kept).
	GCGrace time.Duration
	// AllowDamaged opens a store whose index files or refs fail to decode
	// instead of failing: the damage is reported by Verify, and nothing is
	// written or deleted at open. Ref updates and GC are refused while refs
	// may be lost. Meant for verify tools; Recover and RebuildIndex repair.
	AllowDamaged bool

	// repair (Recover) opens a store whose ref log lost records, keeping
	// the refs that could be read, and writes the log anew.
	repair bool
}

func (o *Options) withDefaults() (Options, cdc.Params, error) {
	var r Options
	if o != nil {
		r = *o
	}
	p, err := cdc.NewParams(r.MinChunk, r.AvgChunk, r.MaxChunk)
	if err != nil {
		return r, p, fmt.Errorf("chunkstore: %w", err)
	}
	r.MinChunk, r.AvgChunk, r.MaxChunk = p.Min, p.Avg, p.Max
	if r.PackSize <= 0 {
		r.PackSize = 32 << 20
	}
	if r.Level == 0 {
		r.Level = 2
	}
	if r.Workers <= 0 {
		r.Workers = runtime.GOMAXPROCS(0)
	}
	if r.GCGrace == 0 {
		r.GCGrace = 10 * time.Minute
	} else if r.GCGrace < 0 {
		r.GCGrace = 0
	}
	if r.CacheBytes == 0 {
		r.CacheBytes = 16 << 20
	}
	return r, p, nil
}

// Store is a content-addressed store in one directory. It is safe for use
// by many goroutines; one process at a time may open a directory.
type Store struct {
	dir     string
	opts    Options
	params  cdc.Params
	lockF   *os.File
	enc     *zstd.Encoder
	encNode *zstd.Encoder // nodes under smallNode bytes: the fastest level when enc is at the default, else enc
	dec     *zstd.Decoder
	cache   *chunkCache

	mu       sync.RWMutex
	closed   bool
	index    map[ID]loc
	packs    map[uint32]*os.File // sealed and open packs, by number
	w        *packWriter         // open pack, nil until the first put
	fl       *flights            // pack buffers being written
	dirty    []*os.File          // sealed packs not yet fsync'd
	pending  []indexEntry        // entries not yet in an index file
	nextPack uint32
	nextIdx  uint64
	idxFiles []uint64 // index files on disk, by number
	refs     map[string]ID
	damage   []Damage // found at open
	idxBad   bool     // an index file failed to decode (AllowDamaged)

	newPacks        bool           // packs created since the packs directory was last fsync'd
	journaled       []indexEntry   // objects in the ref log, not yet in an index file
	logObjects      bool           // the ref log holds objects (journaled or left by a crash)
	refPrefixes     map[string]int // '/'-prefixes of ref names, with the number of refs below
	refLog          *os.File       // the ref log, open for appends (nil until written)
	refLogSize      int64          // length of its valid records
	refLogEnd       int64          // length of the file: zeros follow refLogSize up to it (refLogAhead)
	refLogBase      int64          // length its last rewrite wrote (headers and ref table)
	refLogSeq       uint64         // sequence number of its next record
	deferred        []refOp        // ref changes applied but not yet written (UpdateRefsDeferred)
	refLogFix       []byte         // a record whose copy a crash tore: written again before the next frame
	refLogSalt      uint32         // seeds its record checksums
	refLogTorn      bool           // bytes of a torn record follow refLogSize, not zeros only
	refLogErr       error          // set when the log cannot take more records
	refLogCompactAt int64          // size at which the next update rewrites the log

	logicalDurable uint64 // logical bytes recorded in index files
	logicalPending uint64 // logical bytes put since the last index file

	gcMu       sync.Mutex // one GC at a time
	touchMu    sync.Mutex
	opened     time.Time
	touched    map[ID]time.Duration // objects put or found, with when (since opened)
	touchCount int64
	lastPrune  time.Duration
	deltaSize  int       // entries in index files written since the last whole-store index
	smallBufs  sync.Pool // *[]byte of smallStream bytes
}

// packWriter appends records to the open pack through a buffer.
type packWriter struct {
	num  uint32
	f    *os.File
	base int64 // file offset of buf[0]
	buf  []byte
}

func (w *packWriter) size() int64 { return w.base + int64(len(w.buf)) }

const writeBufSize = 4 << 20

func packName(n uint32) string  { return fmt.Sprintf("%08x.pack", n) }
func indexName(n uint64) string { return fmt.Sprintf("%016x.idx", n) }

// Close flushes everything put so far and releases the store.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	err := s.checkpointLocked(false)
	if err == nil && s.refLog != nil && s.refLogErr == nil && !s.opts.AllowDamaged && (s.refLogSize > s.refLogBase || len(s.deferred) > 0) {
		// A clean close leaves only the rewritten part, whose length the
		// header records: any later loss of its bytes is then damage. Its
		// table holds the deferred ref changes too.
		err = s.rewriteRefLogLocked()
	} else if err == nil && len(s.deferred) > 0 {
		err = s.commitLocked(nil)
	}
	s.closed = true
	s.closeFiles()
	return err
}

func (s *Store) closeFiles() {
	if s.fl != nil {
		s.fl.stop()
	}
	for _, f := range s.packs {
		f.Close()
	}
	if s.w != nil {
		s.w.f.Close()
	}
	if s.refLog != nil {
		s.refLog.Close()
	}
	if s.encNode != nil && s.encNode != s.enc {
		s.encNode.Close()
	}
	if s.enc != nil {
		s.enc.Close()
	}
	if s.dec != nil {
		s.dec.Close()
	}
	s.lockF.Close()
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// prepared is an object ready to be appended: its id, kind and the bytes
// to store (compressed or raw).
type prepared struct {
	id     ID
	kind   uint8
	codec  uint8
	ulen   uint32
	stored []byte
}

// prepare compresses data with zstd (into scratch's spare capacity) and
// keeps the result only if it saves at least 1/64. Large chunks are
// sampled first: if 8 KiB from their middle do not shrink, the chunk is
// stored raw without compressing the rest (random or already compressed
// data costs a fraction of a full attempt).
func (s *Store) prepare(id ID, kind uint8, data []byte, scratch []byte) prepared {
	p := prepared{id: id, kind: kind, codec: codecRaw, ulen: uint32(len(data)), stored: data}
	if s.opts.Level <= 0 || len(data) < 64 {
		return p
	}
	if len(data) >= 32<<10 {
		mid := len(data)/2 - sampleSize/2
		c := s.enc.EncodeAll(data[mid:mid+sampleSize], scratch[:0])
		if len(c) > sampleSize-sampleSize/32 {
			return p
		}
	} else if len(data) >= 2048 && looksRandom(data) {
		return p
	}
	enc := s.enc
	if kind == kindNode && len(data) < smallNode {
		enc = s.encNode
	}
	c := enc.EncodeAll(data, scratch[:0])
	if len(c) < len(data)-len(data)/64 {
		p.codec, p.stored = codecZstd, c
	}
	return p
}

const sampleSize = 8 << 10

// smallNode bounds the nodes compressed at the fastest level: on the
// directory objects of the Go source tree it stores 6% more bytes than the
// default level (0.788 against 0.743 of their size) for about 60% of the
// CPU, which every commit spends (ADR 0189).
const smallNode = 16 << 10

// looksRandom reports whether data's byte histogram is as flat as random
// bytes': its chi-square statistic against the uniform distribution is
// within six standard deviations (6*sqrt(2*255)) of the 255 random data
// shows. The order-0 entropy of such data is then within about
// chi2/(2 n ln 2) bits of 8: less than 1% to gain for n = 4096.
func looksRandom(data []byte) bool {
	var h0, h1, h2, h3 [256]uint32
	i := 0
	for ; i+4 <= len(data); i += 4 {
		h0[data[i]]++
		h1[data[i+1]]++
		h2[data[i+2]]++
		h3[data[i+3]]++
	}
	for ; i < len(data); i++ {
		h0[data[i]]++
	}
	n := float64(len(data))
	e := n / 256
	var chi2 float64
	for k := range h0 {
		d := float64(h0[k]+h1[k]+h2[k]+h3[k]) - e
		chi2 += d * d
	}
	chi2 /= e
	return chi2 < 255+6*22.6
}

// lookup reports where id is stored and records it as recently used, so
// that the next two GCs keep it (see GC).
func (s *Store) lookup(id ID) (loc, bool) {
	s.mu.RLock()
	l, ok := s.index[id]
	if ok {
		s.touch(id) // under s.mu, so that no sweep runs between look-up and touch
	}
	s.mu.RUnlock()
	return l, ok
}

func (s *Store) touch(id ID) {
	s.touchMu.Lock()
	now := time.Since(s.opened)
	s.touched[id] = now
	// Forget touches older than the grace period now and then, so that
	// the map stays bounded in a process that never runs GC.
	if s.touchCount++; s.touchCount%(1<<16) == 0 && now-s.lastPrune > s.opts.GCGrace/2 {
		for k, t := range s.touched {
			if t < now-s.opts.GCGrace {
				delete(s.touched, k)
			}
		}
		s.lastPrune = now
	}
	s.touchMu.Unlock()
}

// add appends a prepared object to the open pack unless it is already
// stored with the same kind.
func (s *Store) add(p prepared) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("chunkstore: %s: store is closed", s.dir)
	}
	if l, ok := s.index[p.id]; ok && (l.kind == p.kind || p.kind == kindBlob) {
		s.touch(p.id)
		return nil
	}
	return s.appendLocked(p.kind, p.codec, p.ulen, p.id, p.stored)
}

func (s *Store) appendLocked(kind, codec uint8, ulen uint32, id ID, stored []byte) error {
	if err := s.fl.throttle(); err != nil {
		return err
	}
	if s.w == nil {
		if err := s.newPackLocked(); err != nil {
			return err
		}
	}
	w := s.w
	off := w.size()
	w.buf = appendRecord(w.buf, kind, codec, ulen, id, stored)
	l := loc{pack: w.num, kind: kind, codec: codec, clen: uint32(len(stored)), ulen: ulen, off: off}
	s.index[id] = l
	s.pending = append(s.pending, indexEntry{id: id, loc: l})
	s.touch(id)
	if len(w.buf) >= writeBufSize {
		s.handOffLocked()
	}
	if w.size() >= s.opts.PackSize {
		return s.sealLocked()
	}
	return nil
}

func (s *Store) newPackLocked() error {
	n := s.nextPack
	path := filepath.Join(s.dir, "packs", packName(n))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("chunkstore: create pack %s: %w", path, err)
	}
	s.nextPack++
	s.newPacks = true
	s.w = &packWriter{num: n, f: f, buf: s.fl.newBuf()}
	s.w.buf = append(s.w.buf, encodePackHeader(n)...)
	s.packs[n] = f
	return nil
}

// sealLocked writes out the open pack and closes it for appends; it is
// fsync'd by the next flush.
func (s *Store) sealLocked() error {
	if s.w == nil {
		return nil
	}
	s.handOffLocked()
	s.dirty = append(s.dirty, s.w.f)
	s.w = nil
	return nil
}

// Put stores one chunk and returns its id. All-zero data returns the zero
// ID and stores nothing. Data already stored is not stored again.
func (s *Store) Put(data []byte) (ID, error) {
	if len(data) > maxObject {
		return ID{}, fmt.Errorf("chunkstore: put %d bytes: over the %d byte object limit", len(data), maxObject)
	}
	s.addLogical(uint64(len(data)))
	if isZero(data) {
		return ID{}, nil
	}
	id := Sum(data)
	if _, ok := s.lookup(id); ok {
		return id, nil
	}
	return id, s.add(s.prepare(id, kindBlob, data, nil))
}

func (s *Store) addLogical(n uint64) {
	s.mu.Lock()
	s.logicalPending += n
	s.mu.Unlock()
}
