package chunkstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

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
