package chunkstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

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

// Open opens the store in dir, creating it if dir is missing or empty, and
// takes its lock. If another process holds the lock, Open fails at once
// with ErrLocked, naming the store and the holder's pid.
func Open(dir string, opts *Options) (*Store, error) {
	o, p, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	if err := initDir(dir); err != nil {
		return nil, err
	}
	lockF, err := lockStore(dir)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir, opts: o, params: p, lockF: lockF,
		index: map[ID]loc{}, touched: map[ID]time.Duration{}, opened: time.Now(), packs: map[uint32]*os.File{}, refs: map[string]ID{}, nextPack: 1, nextIdx: 1}
	lvl := zstd.SpeedDefault
	switch o.Level {
	case 1:
		lvl = zstd.SpeedFastest
	case 3:
		lvl = zstd.SpeedBetterCompression
	case 4:
		lvl = zstd.SpeedBestCompression
	}
	s.enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(lvl), zstd.WithEncoderConcurrency(2*o.Workers),
		zstd.WithEncoderCRC(false), zstd.WithZeroFrames(true), zstd.WithLowerEncoderMem(true))
	s.encNode = s.enc
	if err == nil && lvl == zstd.SpeedDefault {
		s.encNode, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2*o.Workers),
			zstd.WithEncoderCRC(false), zstd.WithZeroFrames(true), zstd.WithLowerEncoderMem(true))
	}
	if err == nil {
		s.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(o.Workers), zstd.WithDecoderMaxMemory(maxObject))
	}
	if err != nil {
		lockF.Close()
		return nil, fmt.Errorf("chunkstore: open %s: zstd: %w", dir, err)
	}
	s.cache = newChunkCache(o.CacheBytes)
	s.fl = newFlights()
	s.smallBufs.New = func() any { b := make([]byte, smallStream); return &b }
	if err := s.load(); err != nil {
		s.closeFiles()
		return nil, err
	}
	return s, nil
}

// initDir creates the directory layout and the format marker, or checks
// the marker of an existing store.
func initDir(dir string) error {
	marker := filepath.Join(dir, markerName)
	b, err := os.ReadFile(marker)
	if err == nil {
		if !knownMarker(b) {
			return fmt.Errorf("chunkstore: open %s: %s holds %q, not a format 1, 2 or 3 store: %w", dir, marker, b, ErrCorrupt)
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("chunkstore: open %s: %w", dir, err)
	}
	// Only what an earlier initDir cut short by a crash leaves may be there.
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			switch e.Name() {
			case "lock", "." + markerName + ".tmp", refLogName, "." + refLogName + ".tmp":
				continue
			case "packs", "index":
				if sub, err := os.ReadDir(filepath.Join(dir, e.Name())); err == nil && len(sub) == 0 {
					continue
				}
			}
			return fmt.Errorf("chunkstore: open %s: directory is not empty and has no %s marker", dir, markerName)
		}
	}
	for _, d := range []string{dir, filepath.Join(dir, "packs"), filepath.Join(dir, "index")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("chunkstore: create %s: %w", d, err)
		}
	}
	if err := writeFileAtomic(filepath.Join(dir, refLogName), encodeRefLogHeader(newSalt(), refLogStart)); err != nil {
		return err
	}
	if err := writeFileAtomic(marker, []byte(markerText)); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dir))
}

func knownMarker(b []byte) bool {
	return string(b) == markerText || string(b) == markerTextV2 || string(b) == markerTextV1
}

// IsStore reports whether dir holds a store: its format marker is there
// and names a known format. It creates and changes nothing, so tools can
// refuse a wrong directory before Open (which creates a store in a
// missing or empty one). A marker naming an unknown format is an error.
func IsStore(dir string) (bool, error) {
	marker := filepath.Join(dir, markerName)
	b, err := os.ReadFile(marker)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("chunkstore: %s: %w", dir, err)
	}
	if !knownMarker(b) {
		return false, fmt.Errorf("chunkstore: %s: %s holds %q, not a known store format: %w", dir, marker, b, ErrCorrupt)
	}
	return true, nil
}

// lockStore takes an exclusive flock on dir/lock and writes our pid into it.
func lockStore(dir string) (*os.File, error) {
	name := filepath.Join(dir, "lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chunkstore: open %s: %w", name, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(name)
		f.Close()
		holder := strings.TrimSpace(string(b))
		if errors.Is(err, unix.EWOULDBLOCK) {
			if holder != "" {
				return nil, fmt.Errorf("chunkstore: open %s: %w (pid %s holds %s)", dir, ErrLocked, holder, name)
			}
			return nil, fmt.Errorf("chunkstore: open %s: %w (holder of %s unknown)", dir, ErrLocked, name)
		}
		return nil, fmt.Errorf("chunkstore: lock %s: %w", name, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// load reads the index files and refs and removes leftovers of a crash:
// temporary files and packs that no index file names.
func (s *Store) load() error {
	idxDir := filepath.Join(s.dir, "index")
	ents, err := os.ReadDir(idxDir)
	if err != nil {
		return fmt.Errorf("chunkstore: open %s: %w", s.dir, err)
	}
	damaged := false
	type idxFile struct {
		num     uint64
		path    string
		entries []indexEntry
		logical uint64
		err     error
	}
	var files []idxFile
	base := -1 // position in files of the newest whole-store index
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(idxDir, name)
		if strings.HasSuffix(name, ".tmp") {
			if !s.opts.AllowDamaged {
				os.Remove(path)
			}
			continue
		}
		n, ok := parseNum(name, ".idx", 16)
		if !ok {
			continue
		}
		if n >= s.nextIdx {
			s.nextIdx = n + 1
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("chunkstore: read index %s: %w", path, err)
		}
		entries, logical, full, err := decodeIndex(path, b)
		if err == nil && full {
			base = len(files)
		}
		files = append(files, idxFile{num: n, path: path, entries: entries, logical: logical, err: err})
	}
	// A whole-store index supersedes the files before it (left behind by a
	// crash while they were being removed, or by RebuildIndex replacing
	// damaged ones): they are ignored, damaged or not.
	for i, f := range files {
		if i > base && f.err != nil {
			if !s.opts.AllowDamaged {
				return fmt.Errorf("chunkstore: open %s: %w (run tine store rebuild-index %s)", s.dir, f.err, s.dir)
			}
			s.damage = append(s.damage, Damage{File: f.path, Offset: -1, Problem: f.err.Error()})
			damaged, s.idxBad = true, true
		}
	}
	for i, f := range files {
		if i < base {
			if !s.opts.AllowDamaged && !damaged {
				os.Remove(f.path)
			}
			continue
		}
		if f.err != nil {
			continue
		}
		s.idxFiles = append(s.idxFiles, f.num)
		if i > base {
			s.deltaSize += len(f.entries)
		}
		s.logicalDurable += f.logical
		for _, ent := range f.entries {
			s.index[ent.id] = ent.loc // later index files win (ReadDir sorts by name)
		}
	}
	// The ref log may journal objects a crash kept out of their packs:
	// replay them before deciding which packs are named.
	if err := s.loadRefs(); err != nil {
		return err
	}
	// Open every pack an entry names; remove the packs none names.
	used := map[uint32]bool{}
	for _, l := range s.index {
		used[l.pack] = true
	}
	packDir := filepath.Join(s.dir, "packs")
	ents, err = os.ReadDir(packDir)
	if err != nil {
		return fmt.Errorf("chunkstore: open %s: %w", s.dir, err)
	}
	removed := false
	for _, e := range ents {
		n, ok := parseNum(e.Name(), ".pack", 8)
		if !ok {
			continue
		}
		if n >= uint64(s.nextPack) {
			s.nextPack = uint32(n) + 1
		}
		path := filepath.Join(packDir, e.Name())
		if !used[uint32(n)] {
			if !damaged && !s.opts.AllowDamaged && !s.opts.repair {
				os.Remove(path)
				removed = true
			}
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("chunkstore: open pack %s: %w", path, err)
		}
		s.packs[uint32(n)] = f
	}
	if removed {
		if err := syncDir(packDir); err != nil {
			return err
		}
	}
	for n := range used {
		if s.packs[n] == nil {
			err := fmt.Errorf("chunkstore: open %s: pack %s named by the index is missing (run tine store rebuild-index %s to drop its objects): %w", s.dir, filepath.Join(packDir, packName(n)), s.dir, ErrCorrupt)
			if !s.opts.AllowDamaged {
				return err
			}
			s.damage = append(s.damage, Damage{File: filepath.Join(packDir, packName(n)), Offset: -1, Problem: "pack named by the index is missing"})
			s.idxBad = true
		}
	}
	return nil
}

func parseNum(name, suffix string, digits int) (uint64, bool) {
	if !strings.HasSuffix(name, suffix) || len(name) != digits+len(suffix) {
		return 0, false
	}
	n, err := strconv.ParseUint(name[:digits], 16, 64)
	return n, err == nil
}

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

// Has reports whether the object id is in the store. The zero ID is
// always present.
func (s *Store) Has(id ID) bool {
	if id.IsZero() {
		return true
	}
	_, ok := s.lookup(id)
	return ok
}

// Get returns the bytes of chunk id. It fails with ErrNotFound if the
// store does not hold it and with ErrCorrupt (naming the pack and offset)
// if the stored bytes fail a check. The zero ID has no bytes: Get returns
// an empty slice for it.
func (s *Store) Get(id ID) ([]byte, error) {
	if id.IsZero() {
		return []byte{}, nil
	}
	b, err := s.getShared(id)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(b), nil
}

// read fetches, checks and decodes object id.
func (s *Store) read(id ID) ([]byte, loc, error) {
	s.mu.RLock()
	raw, l, err := s.readRawLocked(id)
	s.mu.RUnlock()
	if err != nil {
		return nil, l, err
	}
	data, err := s.decode(id, l, raw)
	return data, l, err
}

// readRawLocked returns the record (header and stored bytes) of object id.
// The caller holds s.mu (read or write).
func (s *Store) readRawLocked(id ID) ([]byte, loc, error) {
	if s.closed {
		return nil, loc{}, fmt.Errorf("chunkstore: get %s: store %s is closed", id, s.dir)
	}
	l, ok := s.index[id]
	if !ok {
		return nil, l, fmt.Errorf("chunkstore: get %s from %s: %w", id, s.dir, ErrNotFound)
	}
	raw := make([]byte, recHeaderLen+int(l.clen))
	if err := s.readAtLocked(l.pack, l.off, raw); err != nil {
		return nil, l, fmt.Errorf("chunkstore: get %s: %w", id, err)
	}
	return raw, l, nil
}

// readAtLocked fills p from pack n at off: from the open pack's buffer, a
// buffer being written, or the file. The caller holds s.mu.
func (s *Store) readAtLocked(n uint32, off int64, p []byte) error {
	if s.w != nil && n == s.w.num && off >= s.w.base {
		if off+int64(len(p)) > s.w.size() {
			return fmt.Errorf("pack %s offset %d: beyond the end of the pack: %w", s.packPath(n), off, ErrCorrupt)
		}
		copy(p, s.w.buf[off-s.w.base:])
		return nil
	}
	if s.fl.read(n, off, p) {
		return nil
	}
	f := s.packs[n]
	if f == nil {
		return fmt.Errorf("pack %s is missing: %w", s.packPath(n), ErrCorrupt)
	}
	if k, err := f.ReadAt(p, off); err != nil && k < len(p) {
		return fmt.Errorf("read pack %s offset %d: %w (%w)", s.packPath(n), off, err, ErrCorrupt)
	}
	return nil
}

func (s *Store) packPath(n uint32) string { return filepath.Join(s.dir, "packs", packName(n)) }

// decode checks a raw record against its index entry and returns the
// uncompressed, hash-checked bytes.
func (s *Store) decode(id ID, l loc, raw []byte) ([]byte, error) {
	name := s.packPath(l.pack)
	h, stored, err := decodeRecord(name, l.off, raw)
	if err != nil {
		return nil, fmt.Errorf("chunkstore: get %s: %w", id, err)
	}
	if h.id != id || h.kind != l.kind || h.codec != l.codec || h.ulen != l.ulen || h.clen != l.clen {
		return nil, fmt.Errorf("chunkstore: get %s: pack %s offset %d: record header does not match the index: %w", id, name, l.off, ErrCorrupt)
	}
	data := stored
	if h.codec == codecZstd {
		data, err = s.dec.DecodeAll(stored, make([]byte, 0, h.ulen))
		if err != nil {
			return nil, fmt.Errorf("chunkstore: get %s: pack %s offset %d: zstd: %w (%w)", id, name, l.off, err, ErrCorrupt)
		}
	}
	if len(data) != int(h.ulen) {
		return nil, fmt.Errorf("chunkstore: get %s: pack %s offset %d: decoded %d bytes, want %d: %w", id, name, l.off, len(data), h.ulen, ErrCorrupt)
	}
	if Sum(data) != id {
		return nil, fmt.Errorf("chunkstore: get %s: pack %s offset %d: content hash mismatch: %w", id, name, l.off, ErrCorrupt)
	}
	return data, nil
}

// PutNode stores a node: an object that links to other objects (blobs or
// nodes), so that GC keeps them alive. Zero links are allowed and ignored.
// Every other link must name a stored object: PutNode fails with
// ErrNotFound otherwise (for example if a GC removed a chunk the caller
// held for longer than Options.GCGrace; put it again).
func (s *Store) PutNode(links []ID, payload []byte) (ID, error) {
	enc := encodeNode(links, payload)
	if len(enc) > maxObject {
		return ID{}, fmt.Errorf("chunkstore: put node of %d bytes: over the %d byte object limit", len(enc), maxObject)
	}
	id := Sum(enc)
	p := prepared{id: id, kind: kindNode, codec: codecRaw, ulen: uint32(len(enc)), stored: enc}
	s.mu.RLock()
	l, ok := s.index[id]
	s.mu.RUnlock()
	if !ok || l.kind != kindNode {
		p = s.prepare(id, kindNode, enc, nil)
	}
	// Check and touch the links and add the node under one lock, so that
	// no GC sweep can fall between them.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ID{}, fmt.Errorf("chunkstore: put node: store %s is closed", s.dir)
	}
	now := time.Since(s.opened)
	s.touchMu.Lock()
	for _, link := range links {
		if link.IsZero() {
			continue
		}
		if _, ok := s.index[link]; !ok {
			s.touchMu.Unlock()
			return ID{}, fmt.Errorf("chunkstore: put node %s: link %s: object %w in %s", id, link, ErrNotFound, s.dir)
		}
		s.touched[link] = now
	}
	s.touchMu.Unlock()
	if l, ok := s.index[id]; ok && l.kind == kindNode {
		s.touch(id)
		return id, nil
	}
	return id, s.appendLocked(p.kind, p.codec, p.ulen, p.id, p.stored)
}

// GetNode returns the links and payload of node id. It fails with
// ErrNotFound if id is not stored as a node.
func (s *Store) GetNode(id ID) (links []ID, payload []byte, err error) {
	s.mu.RLock()
	l, ok := s.index[id]
	s.mu.RUnlock()
	if !ok || l.kind != kindNode {
		return nil, nil, fmt.Errorf("chunkstore: get node %s from %s: %w", id, s.dir, ErrNotFound)
	}
	b, err := s.Get(id)
	if err != nil {
		return nil, nil, err
	}
	links, payload, err = decodeNode(id, b)
	if err != nil {
		return nil, nil, fmt.Errorf("chunkstore: %s: %w", s.packPath(l.pack), err)
	}
	return links, bytes.Clone(payload), nil
}

// Flush makes every object put so far durable in packs and index files,
// and the deferred ref changes durable in the ref log:
// the packs are fsync'd, then a new index file naming the objects put (or
// journaled in the ref log) since the last one is written, fsync'd and
// renamed into place, and the directories are fsync'd; the ref log is
// rewritten without the objects it journaled. Ref updates do not need it:
// they make the pending objects durable themselves, more cheaply.
func (s *Store) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("chunkstore: flush %s: store is closed", s.dir)
	}
	if err := s.checkpointLocked(false); err != nil {
		return err
	}
	if len(s.deferred) > 0 {
		return s.commitLocked(nil)
	}
	return nil
}

// checkpointLocked fsyncs the packs and writes an index file naming the
// objects put or journaled since the last one, then rewrites the ref log
// without objects (always with rewriteLog).
func (s *Store) checkpointLocked(rewriteLog bool) error {
	if len(s.pending) > 0 || len(s.journaled) > 0 || s.logicalPending > 0 {
		if err := s.syncPacksLocked(); err != nil {
			return err
		}
		entries := append(s.journaled[:len(s.journaled):len(s.journaled)], s.pending...)
		if err := s.writeIndexLocked(entries, s.logicalPending, false); err != nil {
			return err
		}
		s.deltaSize += len(entries)
		s.logicalDurable += s.logicalPending
		s.logicalPending = 0
		s.pending = s.pending[:0]
		s.journaled = nil
		// Replace the index files by one whole-store index when they are
		// many and together large next to the index, so that open stays
		// quick without rewriting a big index on every checkpoint.
		if n := len(s.idxFiles); n > 1024 || n > 64 && s.deltaSize > len(s.index)/8 {
			if err := s.rewriteIndexLocked(); err != nil {
				return err
			}
		}
	}
	if rewriteLog || s.logObjects {
		return s.rewriteRefLogLocked()
	}
	return nil
}

// syncPacksLocked writes out and fsyncs the open pack and the sealed packs
// not yet synced, then the packs directory.
func (s *Store) syncPacksLocked() error {
	if s.w != nil {
		s.handOffLocked()
		s.dirty = append(s.dirty, s.w.f)
	}
	if err := s.fl.drain(); err != nil {
		return err
	}
	if len(s.dirty) == 0 {
		return nil
	}
	for _, f := range s.dirty {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("chunkstore: fsync pack %s: %w", f.Name(), err)
		}
	}
	s.dirty = s.dirty[:0]
	if !s.newPacks {
		return nil // every pack file's name is durable already
	}
	if err := syncDir(filepath.Join(s.dir, "packs")); err != nil {
		return err
	}
	s.newPacks = false
	return nil
}

// writeIndexLocked writes one index file holding entries.
func (s *Store) writeIndexLocked(entries []indexEntry, logical uint64, full bool) error {
	n := s.nextIdx
	path := filepath.Join(s.dir, "index", indexName(n))
	if err := writeFileAtomic(path, encodeIndex(entries, logical, full)); err != nil {
		return err
	}
	s.nextIdx++
	s.idxFiles = append(s.idxFiles, n)
	return nil
}

// rewriteIndexLocked replaces all index files by one holding the whole
// index. The new file is durable before the old ones are removed, so a
// crash leaves either or both, and both describe the same objects.
func (s *Store) rewriteIndexLocked() error {
	if err := s.syncPacksLocked(); err != nil {
		return err
	}
	entries := make([]indexEntry, 0, len(s.index))
	for id, l := range s.index {
		entries = append(entries, indexEntry{id: id, loc: l})
	}
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i].loc, entries[j].loc
		if a.pack != b.pack {
			return a.pack < b.pack
		}
		return a.off < b.off
	})
	old := s.idxFiles
	s.idxFiles = nil
	if err := s.writeIndexLocked(entries, s.logicalDurable+s.logicalPending, true); err != nil {
		s.idxFiles = append(old, s.idxFiles...)
		return err
	}
	s.logicalDurable += s.logicalPending
	s.logicalPending = 0
	s.pending = s.pending[:0]
	s.journaled = nil
	s.deltaSize = 0
	if s.logObjects {
		// The whole index names the journaled objects now; GC may remove
		// packs next, so the log must not bring old places back.
		if err := s.rewriteRefLogLocked(); err != nil {
			return err
		}
	}
	idxDir := filepath.Join(s.dir, "index")
	for _, n := range old {
		if err := os.Remove(filepath.Join(idxDir, indexName(n))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("chunkstore: remove old index: %w", err)
		}
	}
	return syncDir(idxDir)
}

// writeFileAtomic writes path through a temporary file that is fsync'd
// and renamed into place; the directory is fsync'd after.
func writeFileAtomic(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("chunkstore: create %s: %w", tmp, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("chunkstore: write %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("chunkstore: fsync directory %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("chunkstore: fsync directory %s: %w", dir, err)
	}
	return nil
}
