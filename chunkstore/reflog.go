package chunkstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// The ref log (DIR/refs.log) holds every ref: a 16-byte header, then
// records appended one per update (see docs/chunkstore.md). Each record
// lists set and delete operations applied together.

const (
	refLogName      = "refs.log"
	refLogMagic     = "tinerefs"
	refLogVersion   = 2
	refLogHeaderLen = 16 // magic, version u32, zero u32
	refRecHeaderLen = 12 // body length u32, CRC-32C of the length u32, CRC-32C of the body u32

	// maxRefRecord bounds one record's body (a compacted log of about
	// three million refs).
	maxRefRecord = 1 << 30

	refOpSet    = 1
	refOpDelete = 2

	// refLogMinCompact is the log size below which it is never compacted.
	refLogMinCompact = 1 << 20
)

// refOp is one operation of a ref log record: point name at id, or delete
// name when id is zero.
type refOp struct {
	name string
	id   ID
}

func encodeRefLogHeader() []byte {
	b := make([]byte, refLogHeaderLen)
	copy(b, refLogMagic)
	binary.LittleEndian.PutUint32(b[8:], refLogVersion)
	return b
}

// appendRefRecord appends one record holding ops to dst.
func appendRefRecord(dst []byte, ops []refOp) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, refRecHeaderLen)...)
	dst = binary.AppendUvarint(dst, uint64(len(ops)))
	for _, op := range ops {
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
	binary.LittleEndian.PutUint32(h[0:], uint32(len(body)))
	binary.LittleEndian.PutUint32(h[4:], crc32.Checksum(h[0:4], castagnoli))
	binary.LittleEndian.PutUint32(h[8:], crc32.Checksum(body, castagnoli))
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
	if binary.LittleEndian.Uint32(b[12:]) != 0 {
		return nil, 0, fmt.Errorf("ref log %s offset 12: reserved bytes set: %w", name, ErrCorrupt)
	}
	off := refLogHeaderLen
	for off < len(b) {
		ops, n, rerr := decodeRefRecord(b[off:])
		if rerr != nil {
			for q := off + 1; q+refRecHeaderLen <= len(b); q++ {
				if !refRecHeaderOK(b[q:]) {
					continue
				}
				if _, _, err := decodeRefRecord(b[q:]); err == nil {
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

func refRecHeaderOK(b []byte) bool {
	return len(b) >= refRecHeaderLen && crc32.Checksum(b[0:4], castagnoli) == binary.LittleEndian.Uint32(b[4:])
}

// decodeRefRecord parses the record at the start of b and returns its
// operations and length.
func decodeRefRecord(b []byte) ([]refOp, int, error) {
	if len(b) < refRecHeaderLen {
		return nil, 0, fmt.Errorf("truncated record header (%d bytes)", len(b))
	}
	if !refRecHeaderOK(b) {
		return nil, 0, errors.New("record header checksum mismatch")
	}
	n := binary.LittleEndian.Uint32(b[0:])
	if n > maxRefRecord || int64(n) > int64(len(b)-refRecHeaderLen) {
		return nil, 0, fmt.Errorf("record of %d bytes runs past the end (%d bytes left)", n, len(b)-refRecHeaderLen)
	}
	body := b[refRecHeaderLen : refRecHeaderLen+int(n)]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
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
	for _, ops := range recs {
		for _, op := range ops {
			s.applyRefOp(op)
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return true, fmt.Errorf("chunkstore: open ref log %s: %w", path, err)
	}
	s.refLog = f
	s.refLogSize = good
	s.refLogTorn = good < int64(len(b)) && s.refLogErr == nil
	s.refLogCompactAt = max(refLogMinCompact, 4*good)
	return true, nil
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
// one fdatasync, or a fresh log when the log has grown large next to the
// refs it holds (or does not exist yet). s.refs must already hold the
// result of ops.
func (s *Store) appendRefsLocked(ops []refOp) error {
	if s.refLogErr != nil {
		return fmt.Errorf("chunkstore: ref log %s: %w", s.refLogPath(), s.refLogErr)
	}
	if s.refLog == nil || s.refLogSize >= s.refLogCompactAt {
		return s.rewriteRefLogLocked()
	}
	rec := appendRefRecord(nil, ops)
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
// through a temporary file renamed into place.
func (s *Store) rewriteRefLogLocked() error {
	path := s.refLogPath()
	b := encodeRefLogHeader()
	if len(s.refs) > 0 {
		ops := make([]refOp, 0, len(s.refs))
		for n, id := range s.refs {
			ops = append(ops, refOp{name: n, id: id})
		}
		b = appendRefRecord(b, ops)
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
	s.refLog, s.refLogSize, s.refLogTorn = f, int64(len(b)), false
	s.refLogCompactAt = max(refLogMinCompact, 4*int64(len(b)))
	return nil
}
