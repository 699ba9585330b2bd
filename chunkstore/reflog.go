package chunkstore

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// The ref log (DIR/refs.log) holds every ref and journals recent objects:
// a 16-byte header, then records appended one per commit (see
// docs/chunkstore.md). Each record lists operations applied together: ref
// sets and deletes, and copies of pack records put since the last
// checkpoint, so that one fdatasync makes both durable. A checkpoint
// (fsync the packs, write an index file, rewrite the log without objects)
// happens when the log grows, at Close and GC, and at Open when the log
// holds objects (they are written into their packs first).

const (
	refLogName      = "refs.log"
	refLogMagic     = "tinerefs"
	refLogVersion   = 2
	refLogHeaderLen = 20 // magic, version u32, salt u32, CRC-32C of the 16 bytes before u32
	refRecHeaderLen = 12 // body length u32, CRC-32C of the length u32, CRC-32C of the body u32

	// maxRefRecord bounds one record's body (a compacted log of about
	// three million refs).
	maxRefRecord = 1 << 30

	refOpSet    = 1
	refOpDelete = 2
	refOpObject = 3

	// journalMax bounds the object bytes one commit copies into the log;
	// a larger commit fsyncs the packs and writes an index file instead.
	journalMax = 1 << 20
	// journalCheckpoint is the log size at which the next commit
	// checkpoints, when the log holds objects.
	journalCheckpoint = 8 << 20

	// refLogMinCompact is the log size below which it is never compacted.
	refLogMinCompact = 1 << 20
)

// refOp is one operation of a ref log record: point name at id, or delete
// name when id is zero; or, when raw is set, the pack record raw of object
// id stored in pack at off.
type refOp struct {
	name string
	id   ID
	pack uint32
	off  int64
	raw  []byte
}

// encodeRefLogHeader returns a log header with salt. The salt, random per
// log file, seeds every record's checksums: bytes a sandbox wrote into an
// object (journaled verbatim) cannot pass for a record of this log.
func encodeRefLogHeader(salt uint32) []byte {
	b := make([]byte, refLogHeaderLen)
	copy(b, refLogMagic)
	binary.LittleEndian.PutUint32(b[8:], refLogVersion)
	binary.LittleEndian.PutUint32(b[12:], salt)
	binary.LittleEndian.PutUint32(b[16:], crc32.Checksum(b[:16], castagnoli))
	return b
}

// logSalt returns the salt of a log starting with b (0 if too short).
func logSalt(b []byte) uint32 {
	if len(b) < refLogHeaderLen {
		return 0
	}
	return binary.LittleEndian.Uint32(b[12:])
}

// saltSeed is the CRC-32C state the record checksums start from.
func saltSeed(salt uint32) uint32 {
	return crc32.Checksum(binary.LittleEndian.AppendUint32(nil, salt), castagnoli)
}

func newSalt() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

// appendRefRecord appends one record holding ops to dst, for a log with
// salt.
func appendRefRecord(dst []byte, salt uint32, ops []refOp) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, refRecHeaderLen)...)
	dst = binary.AppendUvarint(dst, uint64(len(ops)))
	for _, op := range ops {
		if op.raw != nil {
			dst = append(dst, refOpObject)
			dst = binary.LittleEndian.AppendUint32(dst, op.pack)
			dst = binary.LittleEndian.AppendUint64(dst, uint64(op.off))
			dst = append(dst, op.raw...)
			continue
		}
		if op.id.IsZero() {
			dst = append(dst, refOpDelete)
		} else {
			dst = append(dst, refOpSet)
		}
		dst = binary.AppendUvarint(dst, uint64(len(op.name)))
		dst = append(dst, op.name...)
		if !op.id.IsZero() {
			dst = append(dst, op.id[:]...)
		}
	}
	body := dst[start+refRecHeaderLen:]
	h := dst[start:]
	seed := saltSeed(salt)
	binary.LittleEndian.PutUint32(h[0:], uint32(len(body)))
	binary.LittleEndian.PutUint32(h[4:], crc32.Update(seed, castagnoli, h[0:4]))
	binary.LittleEndian.PutUint32(h[8:], crc32.Update(seed, castagnoli, body))
	return dst
}

// decodeRefLog parses a ref log file named name. It returns the records
// and the length of the valid prefix: a bad record after which no valid
// record follows is a write torn by a crash (its update never returned),
// so it ends the log without an error. A bad header, or a bad record
// followed by a valid one, is damage: the error names the file and the
// offset, and recs holds the records before it. It never panics.
func decodeRefLog(name string, b []byte) (recs [][]refOp, good int64, err error) {
	if len(b) < refLogHeaderLen {
		return nil, 0, fmt.Errorf("ref log %s offset 0: truncated header (%d bytes): %w", name, len(b), ErrCorrupt)
	}
	if string(b[:8]) != refLogMagic {
		return nil, 0, fmt.Errorf("ref log %s offset 0: bad magic %q: %w", name, b[:8], ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != refLogVersion {
		return nil, 0, fmt.Errorf("ref log %s offset 8: unsupported version %d: %w", name, v, ErrCorrupt)
	}
	if crc32.Checksum(b[:16], castagnoli) != binary.LittleEndian.Uint32(b[16:]) {
		return nil, 0, fmt.Errorf("ref log %s offset 16: header checksum mismatch: %w", name, ErrCorrupt)
	}
	seed := saltSeed(logSalt(b))
	off := refLogHeaderLen
	for off < len(b) {
		ops, n, rerr := decodeRefRecord(b[off:], seed)
		if rerr != nil {
			for q := off + 1; q+refRecHeaderLen <= len(b); q++ {
				if !refRecHeaderOK(b[q:], seed) {
					continue
				}
				if _, _, err := decodeRefRecord(b[q:], seed); err == nil {
					return recs, int64(off), fmt.Errorf("ref log %s offset %d: %w, and a valid record follows at offset %d (%w)", name, off, rerr, q, ErrCorrupt)
				}
			}
			return recs, int64(off), nil // torn tail
		}
		recs = append(recs, ops)
		off += n
	}
	return recs, int64(off), nil
}

func refRecHeaderOK(b []byte, seed uint32) bool {
	return len(b) >= refRecHeaderLen && crc32.Update(seed, castagnoli, b[0:4]) == binary.LittleEndian.Uint32(b[4:])
}

// decodeRefRecord parses the record at the start of b, whose checksums
// start from seed, and returns its operations and length.
func decodeRefRecord(b []byte, seed uint32) ([]refOp, int, error) {
	if len(b) < refRecHeaderLen {
		return nil, 0, fmt.Errorf("truncated record header (%d bytes)", len(b))
	}
	if !refRecHeaderOK(b, seed) {
		return nil, 0, errors.New("record header checksum mismatch")
	}
	n := binary.LittleEndian.Uint32(b[0:])
	if n > maxRefRecord || int64(n) > int64(len(b)-refRecHeaderLen) {
		return nil, 0, fmt.Errorf("record of %d bytes runs past the end (%d bytes left)", n, len(b)-refRecHeaderLen)
	}
	body := b[refRecHeaderLen : refRecHeaderLen+int(n)]
	if crc32.Update(seed, castagnoli, body) != binary.LittleEndian.Uint32(b[8:]) {
		return nil, 0, errors.New("record checksum mismatch")
	}
	count, k := binary.Uvarint(body)
	if k <= 0 || k != len(binary.AppendUvarint(nil, count)) || count == 0 || count > uint64(len(body)) {
		return nil, 0, errors.New("bad operation count")
	}
	p := k
	ops := make([]refOp, 0, count)
	for range count {
		if p >= len(body) {
			return nil, 0, errors.New("record ends inside an operation")
		}
		kind := body[p]
		p++
		if kind == refOpObject {
			if len(body)-p < 12 {
				return nil, 0, errors.New("record ends inside an object's place")
			}
			op := refOp{pack: binary.LittleEndian.Uint32(body[p:])}
			o := binary.LittleEndian.Uint64(body[p+4:])
			p += 12
			if o < packHeaderLen || o > 1<<62 {
				return nil, 0, fmt.Errorf("bad pack offset %d", o)
			}
			op.off = int64(o)
			h, _, err := decodeRecord(packName(op.pack), op.off, body[p:])
			if err != nil {
				return nil, 0, err
			}
			op.id = h.id
			op.raw = body[p : p+recHeaderLen+int(h.clen) : p+recHeaderLen+int(h.clen)]
			p += len(op.raw)
			ops = append(ops, op)
			continue
		}
		if kind != refOpSet && kind != refOpDelete {
			return nil, 0, fmt.Errorf("bad operation %d", kind)
		}
		l, k := binary.Uvarint(body[p:])
		if k <= 0 || k != len(binary.AppendUvarint(nil, l)) || l > 255 || l > uint64(len(body)-p-k) {
			return nil, 0, errors.New("bad ref name length")
		}
		p += k
		op := refOp{name: string(body[p : p+int(l)])}
		p += int(l)
		if err := validRefName(op.name); err != nil {
			return nil, 0, err
		}
		if kind == refOpSet {
			if len(body)-p < 32 {
				return nil, 0, errors.New("record ends inside an id")
			}
			copy(op.id[:], body[p:p+32])
			p += 32
			if op.id.IsZero() {
				return nil, 0, errors.New("set to the zero id")
			}
		}
		ops = append(ops, op)
	}
	if p != len(body) {
		return nil, 0, fmt.Errorf("%d bytes after the last operation", len(body)-p)
	}
	return ops, refRecHeaderLen + len(body), nil
}

func (s *Store) refLogPath() string { return filepath.Join(s.dir, refLogName) }

// loadRefLog replays the ref log into s.refs. It reports whether the log
// exists.
func (s *Store) loadRefLog() (bool, error) {
	path := s.refLogPath()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("chunkstore: read ref log %s: %w", path, err)
	}
	recs, good, err := decodeRefLog(path, b)
	if err != nil {
		if !s.opts.AllowDamaged {
			return true, fmt.Errorf("chunkstore: open %s: %w", s.dir, err)
		}
		s.damage = append(s.damage, Damage{File: path, Offset: good, Problem: err.Error()})
		s.refLogErr = err
	}
	var objs []refOp
	for _, ops := range recs {
		for _, op := range ops {
			if op.raw != nil {
				objs = append(objs, op)
				s.logObjects = true
				continue
			}
			s.applyRefOp(op)
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return true, fmt.Errorf("chunkstore: open ref log %s: %w", path, err)
	}
	s.refLog = f
	s.refLogSalt = logSalt(b)
	s.refLogSize = good
	s.refLogTorn = good < int64(len(b)) && s.refLogErr == nil
	s.refLogCompactAt = max(refLogMinCompact, 4*good)
	if len(objs) > 0 && s.refLogErr == nil {
		if err := s.replayObjectsLocked(objs); err != nil {
			return true, err
		}
	}
	return true, nil
}

// replayObjectsLocked writes the objects journaled in the log into their
// packs at their offsets (their pack writes may not have reached the disk
// before a crash), fsyncs the packs, records them in an index file and
// rewrites the log without them.
func (s *Store) replayObjectsLocked(objs []refOp) error {
	byPack := map[uint32][]refOp{}
	for _, o := range objs {
		byPack[o.pack] = append(byPack[o.pack], o)
	}
	packDir := filepath.Join(s.dir, "packs")
	for n, os_ := range byPack {
		path := filepath.Join(packDir, packName(n))
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("chunkstore: replay ref log into pack %s: %w", path, err)
		}
		hdr := make([]byte, packHeaderLen)
		if k, _ := f.ReadAt(hdr, 0); k < packHeaderLen || !validPackHeader(hdr, n) {
			_, err = f.WriteAt(encodePackHeader(n), 0)
		}
		for _, o := range os_ {
			if err == nil {
				_, err = f.WriteAt(o.raw, o.off)
			}
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("chunkstore: replay ref log into pack %s: %w", path, err)
		}
		if n >= s.nextPack {
			s.nextPack = n + 1
		}
	}
	if err := syncDir(packDir); err != nil {
		return err
	}
	entries := make([]indexEntry, 0, len(objs))
	for _, o := range objs {
		var h recHeader
		h.kind, h.codec = o.raw[0], o.raw[1]
		h.ulen = binary.LittleEndian.Uint32(o.raw[4:])
		l := loc{pack: o.pack, kind: h.kind, codec: h.codec, clen: uint32(len(o.raw) - recHeaderLen), ulen: h.ulen, off: o.off}
		entries = append(entries, indexEntry{id: o.id, loc: l})
		s.index[o.id] = l
	}
	if err := s.writeIndexLocked(entries, 0, false); err != nil {
		return err
	}
	s.deltaSize += len(entries)
	return s.rewriteRefLogLocked()
}

func validPackHeader(b []byte, n uint32) bool {
	got, err := decodePackHeader("", b)
	return err == nil && got == n
}

// journalObjectsLocked returns log operations copying the pending
// objects' pack records, or ok false if they are over journalMax bytes.
func (s *Store) journalObjectsLocked() (ops []refOp, ok bool, err error) {
	total := 0
	for _, e := range s.pending {
		total += recHeaderLen + int(e.loc.clen)
		if total > journalMax {
			return nil, false, nil
		}
	}
	ops = make([]refOp, 0, len(s.pending))
	for _, e := range s.pending {
		raw := make([]byte, recHeaderLen+int(e.loc.clen))
		if err := s.readAtLocked(e.loc.pack, e.loc.off, raw); err != nil {
			return nil, false, fmt.Errorf("chunkstore: journal %s: %w", e.id, err)
		}
		ops = append(ops, refOp{id: e.id, pack: e.loc.pack, off: e.loc.off, raw: raw})
	}
	return ops, true, nil
}

// commitLocked makes the pending objects and the ref operations ops
// (already applied to s.refs) durable. Usually that is one log record and
// one fdatasync; a large commit, or a full log, checkpoints first.
func (s *Store) commitLocked(ops []refOp) error {
	if s.refLogErr != nil {
		return fmt.Errorf("chunkstore: ref log %s: %w", s.refLogPath(), s.refLogErr)
	}
	if s.refLog == nil || s.refLogSize >= s.refLogCompactAt || s.logObjects && s.refLogSize >= journalCheckpoint {
		// The rewritten log holds s.refs, ops included.
		return s.checkpointLocked(true)
	}
	objs, ok, err := s.journalObjectsLocked()
	if err != nil {
		return err
	}
	if !ok {
		if err := s.checkpointLocked(false); err != nil {
			return err
		}
		objs = nil
	}
	if len(objs)+len(ops) == 0 {
		return nil
	}
	if err := s.appendRefsLocked(append(objs, ops...)); err != nil {
		return err
	}
	if len(objs) > 0 {
		s.journaled = append(s.journaled, s.pending...)
		s.pending = s.pending[:0]
		s.logObjects = true
	}
	return nil
}

// applyRefOp changes the in-memory refs (and their directory counts).
func (s *Store) applyRefOp(op refOp) {
	_, had := s.refs[op.name]
	if op.id.IsZero() {
		if had {
			delete(s.refs, op.name)
			s.refDirs(op.name, -1)
		}
		return
	}
	s.refs[op.name] = op.id
	if !had {
		s.refDirs(op.name, 1)
	}
}

// refDirs counts, for each '/'-prefix of name, the refs below it.
func (s *Store) refDirs(name string, d int) {
	for i := len(name) - 1; i > 0; i-- {
		if name[i] == '/' {
			p := name[:i]
			if s.refPrefixes[p] += d; s.refPrefixes[p] <= 0 {
				delete(s.refPrefixes, p)
			}
		}
	}
}

// appendRefsLocked makes ops durable: one record appended to the log and
// one fdatasync.
func (s *Store) appendRefsLocked(ops []refOp) error {
	if s.refLogErr != nil {
		return fmt.Errorf("chunkstore: ref log %s: %w", s.refLogPath(), s.refLogErr)
	}
	rec := appendRefRecord(nil, s.refLogSalt, ops)
	if s.refLogTorn {
		if err := s.refLog.Truncate(s.refLogSize); err != nil {
			return fmt.Errorf("chunkstore: ref log %s: cut torn tail at %d: %w", s.refLogPath(), s.refLogSize, err)
		}
		s.refLogTorn = false
	}
	_, err := s.refLog.WriteAt(rec, s.refLogSize)
	if err == nil {
		err = fdatasync(s.refLog)
	}
	if err != nil {
		// The record may be partly on disk: cut it off, so that no later
		// record follows it; if that fails too, refuse further updates.
		if terr := s.refLog.Truncate(s.refLogSize); terr == nil {
			terr = fdatasync(s.refLog)
			if terr != nil {
				s.refLogErr = terr
			}
		} else {
			s.refLogErr = terr
		}
		return fmt.Errorf("chunkstore: append to ref log %s: %w", s.refLogPath(), err)
	}
	s.refLogSize += int64(len(rec))
	return nil
}

// rewriteRefLogLocked writes a fresh log holding s.refs in one record,
// through a temporary file renamed into place. Objects journaled in the
// old log must be in index files and fsync'd packs before.
func (s *Store) rewriteRefLogLocked() error {
	path := s.refLogPath()
	salt := newSalt()
	b := encodeRefLogHeader(salt)
	if len(s.refs) > 0 {
		ops := make([]refOp, 0, len(s.refs))
		for n, id := range s.refs {
			ops = append(ops, refOp{name: n, id: id})
		}
		b = appendRefRecord(b, salt, ops)
	}
	if err := writeFileAtomic(path, b); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		s.refLogErr = err
		return fmt.Errorf("chunkstore: open ref log %s: %w", path, err)
	}
	if s.refLog != nil {
		s.refLog.Close()
	}
	s.refLog, s.refLogSalt, s.refLogSize, s.refLogTorn, s.logObjects = f, salt, int64(len(b)), false, false
	s.refLogCompactAt = max(refLogMinCompact, 4*int64(len(b)))
	return nil
}
