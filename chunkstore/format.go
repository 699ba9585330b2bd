package chunkstore

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"
	"strings"
)

// On-disk format: store format 3 (the ref log, ADR 0041); packs and index files are
// version 1. See docs/chunkstore.md for the full layout.

const (
	formatVersion = 1

	markerName   = "tine-store"
	markerText   = "tine chunkstore\nformat 3\n"
	markerTextV2 = "tine chunkstore\nformat 2\n" // ref log without copies: rewritten at open
	markerTextV1 = "tine chunkstore\nformat 1\n" // refs in files under refs/: moved into the ref log at open

	packMagic     = "tinepak\x00"
	packHeaderLen = 16 // magic, version u32, pack number u32
	recHeaderLen  = 48 // kind u8, codec u8, zero u16, ulen u32, clen u32, crc u32, id [32]

	idxMagic     = "tineidx\x00"
	idxHeaderLen = 32 // magic, version u32, flags u32, count u64, logical bytes u64
	idxEntryLen  = 56 // id [32], pack u32, offset u64, clen u32, ulen u32, kind u8, codec u8, zero u16
	idxTrailer   = 32 // SHA-256 of everything before it

	// maxObject bounds one stored object (chunk or node encoding).
	maxObject = 256 << 20
)

// Object kinds.
const (
	kindBlob = 1
	kindNode = 2
)

// Codecs of stored bytes.
const (
	codecRaw  = 0
	codecZstd = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recHeader is the fixed header in front of each object in a pack.
type recHeader struct {
	kind, codec uint8
	ulen, clen  uint32
	crc         uint32
	id          ID
}

func encodePackHeader(num uint32) []byte {
	b := make([]byte, packHeaderLen)
	copy(b, packMagic)
	binary.LittleEndian.PutUint32(b[8:], formatVersion)
	binary.LittleEndian.PutUint32(b[12:], num)
	return b
}

// decodePackHeader checks the first bytes of pack file name.
func decodePackHeader(name string, b []byte) (num uint32, err error) {
	if len(b) < packHeaderLen {
		return 0, fmt.Errorf("pack %s offset 0: truncated header (%d bytes): %w", name, len(b), ErrCorrupt)
	}
	if string(b[:8]) != packMagic {
		return 0, fmt.Errorf("pack %s offset 0: bad magic %q: %w", name, b[:8], ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != formatVersion {
		return 0, fmt.Errorf("pack %s offset 8: unsupported format version %d: %w", name, v, ErrCorrupt)
	}
	return binary.LittleEndian.Uint32(b[12:]), nil
}

// recordCRC is the CRC-32C over the header (without the crc field) and the
// stored bytes.
func recordCRC(hdr []byte, stored []byte) uint32 {
	c := crc32.Update(0, castagnoli, hdr[0:12])
	c = crc32.Update(c, castagnoli, hdr[16:48])
	return crc32.Update(c, castagnoli, stored)
}

// appendRecord appends a record (header + stored bytes) to dst.
func appendRecord(dst []byte, kind, codec uint8, ulen uint32, id ID, stored []byte) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recHeaderLen)...)
	h := dst[start:]
	h[0], h[1] = kind, codec
	binary.LittleEndian.PutUint32(h[4:], ulen)
	binary.LittleEndian.PutUint32(h[8:], uint32(len(stored)))
	copy(h[16:48], id[:])
	binary.LittleEndian.PutUint32(h[12:], recordCRC(h, stored))
	return append(dst, stored...)
}

// decodeRecord parses the record at offset off of pack name from b, which
// must start at the record; it checks the header and the CRC and returns
// the stored bytes (a sub-slice of b).
func decodeRecord(name string, off int64, b []byte) (recHeader, []byte, error) {
	h, err := decodeRecHeader(name, off, b)
	if err != nil {
		return h, nil, err
	}
	if int64(len(b)-recHeaderLen) < int64(h.clen) {
		return h, nil, fmt.Errorf("pack %s offset %d: truncated record: want %d bytes, have %d: %w", name, off, h.clen, len(b)-recHeaderLen, ErrCorrupt)
	}
	stored := b[recHeaderLen : recHeaderLen+int(h.clen)]
	if c := recordCRC(b, stored); c != h.crc {
		return h, nil, fmt.Errorf("pack %s offset %d: record checksum mismatch (have %08x, want %08x): %w", name, off, c, h.crc, ErrCorrupt)
	}
	return h, stored, nil
}

// decodeRecHeader parses and checks the fields of the record header at
// the start of b (offset off of pack name), not its checksum.
func decodeRecHeader(name string, off int64, b []byte) (recHeader, error) {
	var h recHeader
	if len(b) < recHeaderLen {
		return h, fmt.Errorf("pack %s offset %d: truncated record header (%d bytes): %w", name, off, len(b), ErrCorrupt)
	}
	h.kind, h.codec = b[0], b[1]
	h.ulen = binary.LittleEndian.Uint32(b[4:])
	h.clen = binary.LittleEndian.Uint32(b[8:])
	h.crc = binary.LittleEndian.Uint32(b[12:])
	copy(h.id[:], b[16:48])
	switch {
	case h.kind != kindBlob && h.kind != kindNode:
		return h, fmt.Errorf("pack %s offset %d: bad object kind %d: %w", name, off, h.kind, ErrCorrupt)
	case h.codec != codecRaw && h.codec != codecZstd:
		return h, fmt.Errorf("pack %s offset %d: bad codec %d: %w", name, off, h.codec, ErrCorrupt)
	case b[2] != 0 || b[3] != 0:
		return h, fmt.Errorf("pack %s offset %d: reserved header bytes set: %w", name, off, ErrCorrupt)
	case h.ulen > maxObject || h.clen > maxObject:
		return h, fmt.Errorf("pack %s offset %d: object size %d/%d over limit: %w", name, off, h.ulen, h.clen, ErrCorrupt)
	case h.codec == codecRaw && h.ulen != h.clen:
		return h, fmt.Errorf("pack %s offset %d: raw object with stored size %d != size %d: %w", name, off, h.clen, h.ulen, ErrCorrupt)
	}
	return h, nil
}

// scanChunk is how much of a pack scanPack reads at once.
const scanChunk = 1 << 20

// scanPack walks the records of pack file name (size bytes read through
// r) and calls fn for each valid one, reading at most scanChunk bytes at
// a time. A bad header or a bad record followed by a valid one is listed
// in damage (the scan goes on at the next valid record); end is the end
// of the last valid record: bytes after it, with no valid record, are a
// crash's torn appends or damage no record follows.
func scanPack(name string, r io.ReaderAt, size int64, fn func(off int64, h recHeader)) (damage []Damage, end int64) {
	buf := make([]byte, scanChunk+recHeaderLen)
	hdr := buf[:packHeaderLen]
	if _, err := r.ReadAt(hdr, 0); err != nil {
		return []Damage{{File: name, Offset: 0, Problem: fmt.Sprintf("pack %s offset 0: read header: %v", name, err)}}, 0
	}
	if _, err := decodePackHeader(name, hdr); err != nil {
		damage = append(damage, Damage{File: name, Offset: 0, Problem: err.Error()})
	}
	off := int64(packHeaderLen)
	end = off
	for off < size {
		h, err := checkRecordAt(name, r, size, off, buf)
		if err == nil {
			if fn != nil {
				fn(off, h)
			}
			off += recHeaderLen + int64(h.clen)
			end = off
			continue
		}
		q := nextRecordAt(name, r, size, off+1, buf)
		if q < 0 {
			break
		}
		damage = append(damage, Damage{File: name, Offset: off, Problem: fmt.Sprintf("%v; the next valid record is at offset %d", err, q)})
		off = q
	}
	return damage, end
}

// checkRecordAt checks the record at off (header, size, CRC) reading it
// through buf.
func checkRecordAt(name string, r io.ReaderAt, size, off int64, buf []byte) (recHeader, error) {
	hb := make([]byte, recHeaderLen)
	if k, _ := r.ReadAt(hb, off); k < recHeaderLen {
		return recHeader{}, fmt.Errorf("pack %s offset %d: truncated record header (%d bytes): %w", name, off, k, ErrCorrupt)
	}
	h, err := decodeRecHeader(name, off, hb)
	if err != nil {
		return h, err
	}
	if off+recHeaderLen+int64(h.clen) > size {
		return h, fmt.Errorf("pack %s offset %d: truncated record: want %d bytes, have %d: %w", name, off, h.clen, size-off-recHeaderLen, ErrCorrupt)
	}
	c := crc32.Update(0, castagnoli, hb[0:12])
	c = crc32.Update(c, castagnoli, hb[16:48])
	for p, left := off+recHeaderLen, int64(h.clen); left > 0; {
		n := min(left, int64(len(buf)))
		if k, err := r.ReadAt(buf[:n], p); int64(k) < n {
			return h, fmt.Errorf("pack %s offset %d: read: %v: %w", name, p, err, ErrCorrupt)
		}
		c = crc32.Update(c, castagnoli, buf[:n])
		p, left = p+n, left-n
	}
	if c != h.crc {
		return h, fmt.Errorf("pack %s offset %d: record checksum mismatch (have %08x, want %08x): %w", name, off, c, h.crc, ErrCorrupt)
	}
	return h, nil
}

// nextRecordAt returns the offset of the first valid record at or after
// from, or -1: it looks for plausible headers a window at a time and
// checks each candidate in full.
func nextRecordAt(name string, r io.ReaderAt, size, from int64, buf []byte) int64 {
	win := make([]byte, scanChunk+recHeaderLen)
	for p := from; p+recHeaderLen <= size; p += scanChunk {
		k, _ := r.ReadAt(win, p)
		for i := 0; i < min(k-recHeaderLen+1, scanChunk); i++ {
			if b := win[i:]; b[0]-1 > 1 || b[1] > 1 || b[2]|b[3] != 0 {
				continue // not a kind, codec and zero: skip without building an error
			}
			h, err := decodeRecHeader(name, p+int64(i), win[i:k])
			if err != nil || p+int64(i)+recHeaderLen+int64(h.clen) > size {
				continue
			}
			if _, err := checkRecordAt(name, r, size, p+int64(i), buf); err == nil {
				return p + int64(i)
			}
		}
	}
	return -1
}

// indexEntry is one object's place in a pack.
type indexEntry struct {
	id  ID
	loc loc
}

// loc is where an object lives.
type loc struct {
	pack  uint32
	kind  uint8
	codec uint8
	clen  uint32
	ulen  uint32
	off   int64
}

// idxFull flags an index file that describes the whole store: it
// supersedes every index file with a lower number.
const idxFull = 1

// encodeIndex serializes entries and the logical byte count into an index
// file; full marks it as a whole-store index.
func encodeIndex(entries []indexEntry, logical uint64, full bool) []byte {
	b := make([]byte, idxHeaderLen, idxHeaderLen+len(entries)*idxEntryLen+idxTrailer)
	copy(b, idxMagic)
	binary.LittleEndian.PutUint32(b[8:], formatVersion)
	if full {
		binary.LittleEndian.PutUint32(b[12:], idxFull)
	}
	binary.LittleEndian.PutUint64(b[16:], uint64(len(entries)))
	binary.LittleEndian.PutUint64(b[24:], logical)
	var e [idxEntryLen]byte
	for _, ent := range entries {
		copy(e[0:32], ent.id[:])
		binary.LittleEndian.PutUint32(e[32:], ent.loc.pack)
		binary.LittleEndian.PutUint64(e[36:], uint64(ent.loc.off))
		binary.LittleEndian.PutUint32(e[44:], ent.loc.clen)
		binary.LittleEndian.PutUint32(e[48:], ent.loc.ulen)
		e[52], e[53] = ent.loc.kind, ent.loc.codec
		b = append(b, e[:]...)
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

// decodeIndex parses an index file named name. It never panics; every
// error names the file and the byte offset.
func decodeIndex(name string, b []byte) (entries []indexEntry, logical uint64, full bool, err error) {
	if len(b) < idxHeaderLen+idxTrailer {
		return nil, 0, false, fmt.Errorf("index %s offset 0: truncated (%d bytes): %w", name, len(b), ErrCorrupt)
	}
	if string(b[:8]) != idxMagic {
		return nil, 0, false, fmt.Errorf("index %s offset 0: bad magic %q: %w", name, b[:8], ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != formatVersion {
		return nil, 0, false, fmt.Errorf("index %s offset 8: unsupported format version %d: %w", name, v, ErrCorrupt)
	}
	f := binary.LittleEndian.Uint32(b[12:])
	if f&^idxFull != 0 {
		return nil, 0, false, fmt.Errorf("index %s offset 12: unknown flags %#x: %w", name, f, ErrCorrupt)
	}
	count := binary.LittleEndian.Uint64(b[16:])
	logical = binary.LittleEndian.Uint64(b[24:])
	body := uint64(len(b) - idxHeaderLen - idxTrailer)
	if body%idxEntryLen != 0 || body/idxEntryLen != count {
		return nil, 0, false, fmt.Errorf("index %s offset 16: header says %d entries but file holds %d bytes of entries: %w", name, count, body, ErrCorrupt)
	}
	end := len(b) - idxTrailer
	if sum := sha256.Sum256(b[:end]); string(sum[:]) != string(b[end:]) {
		return nil, 0, false, fmt.Errorf("index %s offset %d: checksum mismatch: %w", name, end, ErrCorrupt)
	}
	entries = make([]indexEntry, 0, count)
	for off := idxHeaderLen; off < end; off += idxEntryLen {
		e := b[off : off+idxEntryLen]
		var ent indexEntry
		copy(ent.id[:], e[0:32])
		ent.loc.pack = binary.LittleEndian.Uint32(e[32:])
		o := binary.LittleEndian.Uint64(e[36:])
		ent.loc.clen = binary.LittleEndian.Uint32(e[44:])
		ent.loc.ulen = binary.LittleEndian.Uint32(e[48:])
		ent.loc.kind, ent.loc.codec = e[52], e[53]
		switch {
		case o < packHeaderLen || o > 1<<62:
			err = fmt.Errorf("bad pack offset %d", o)
		case ent.loc.kind != kindBlob && ent.loc.kind != kindNode:
			err = fmt.Errorf("bad object kind %d", ent.loc.kind)
		case ent.loc.codec != codecRaw && ent.loc.codec != codecZstd:
			err = fmt.Errorf("bad codec %d", ent.loc.codec)
		case e[54] != 0 || e[55] != 0:
			err = fmt.Errorf("reserved bytes set")
		case ent.loc.ulen > maxObject || ent.loc.clen > maxObject:
			err = fmt.Errorf("object size %d/%d over limit", ent.loc.ulen, ent.loc.clen)
		case ent.id.IsZero():
			err = fmt.Errorf("zero id")
		}
		if err != nil {
			return nil, 0, false, fmt.Errorf("index %s offset %d: %w (%w)", name, off, err, ErrCorrupt)
		}
		ent.loc.off = int64(o)
		entries = append(entries, ent)
	}
	return entries, logical, f == idxFull, nil
}

// encodeRef serializes a ref file: the id in hex and a CRC-32C over the
// name and the id, so that damage and misplaced files are both caught.
func encodeRef(name string, id ID) []byte {
	c := crc32.Update(crc32.Checksum([]byte(name), castagnoli), castagnoli, id[:])
	return fmt.Appendf(nil, "%s %08x\n", id, c)
}

// decodeRef parses a ref file of ref name.
func decodeRef(name, file string, b []byte) (ID, error) {
	s := string(b)
	if len(s) != 64+1+8+1 || s[64] != ' ' || s[73] != '\n' {
		return ID{}, fmt.Errorf("ref %s (file %s) offset 0: malformed (%d bytes): %w", name, file, len(b), ErrCorrupt)
	}
	id, err := ParseID(s[:64])
	if err == nil && id.String() != s[:64] {
		err = fmt.Errorf("id not in lowercase hex")
	}
	if err != nil {
		return ID{}, fmt.Errorf("ref %s (file %s) offset 0: %w (%w)", name, file, err, ErrCorrupt)
	}
	want, err := strconv.ParseUint(s[65:73], 16, 32)
	if err != nil || strings.ToLower(s[65:73]) != s[65:73] {
		return ID{}, fmt.Errorf("ref %s (file %s) offset 65: bad checksum field %q: %w", name, file, s[65:73], ErrCorrupt)
	}
	c := crc32.Update(crc32.Checksum([]byte(name), castagnoli), castagnoli, id[:])
	if uint32(want) != c {
		return ID{}, fmt.Errorf("ref %s (file %s) offset 65: checksum mismatch: %w", name, file, ErrCorrupt)
	}
	if id.IsZero() {
		return ID{}, fmt.Errorf("ref %s (file %s) offset 0: zero id: %w", name, file, ErrCorrupt)
	}
	return id, nil
}

// encodeNode returns a node's canonical encoding: a uvarint link count,
// the links (32 bytes each), then the payload.
func encodeNode(links []ID, payload []byte) []byte {
	b := make([]byte, 0, binary.MaxVarintLen64+32*len(links)+len(payload))
	b = binary.AppendUvarint(b, uint64(len(links)))
	for i := range links {
		b = append(b, links[i][:]...)
	}
	return append(b, payload...)
}

// decodeNode parses a node encoding. The returned slices alias b.
func decodeNode(id ID, b []byte) (links []ID, payload []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, nil, fmt.Errorf("node %s offset 0: bad link count: %w", id, ErrCorrupt)
	}
	if n > uint64(len(b)-k)/32 {
		return nil, nil, fmt.Errorf("node %s offset 0: %d links do not fit in %d bytes: %w", id, n, len(b), ErrCorrupt)
	}
	if k != len(binary.AppendUvarint(nil, n)) {
		return nil, nil, fmt.Errorf("node %s offset 0: non-canonical link count: %w", id, ErrCorrupt)
	}
	links = make([]ID, n)
	off := k
	for i := range links {
		copy(links[i][:], b[off:off+32])
		off += 32
	}
	return links, b[off:], nil
}

// validRefName checks a ref name: '/'-separated non-empty parts, none "."
// or ".." or starting with '.', printable ASCII without '\\', at most 255 bytes.
func validRefName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("chunkstore: bad ref name %q: want 1 to 255 bytes", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part[0] == '.' {
			return fmt.Errorf("chunkstore: bad ref name %q: empty part or part starting with '.'", name)
		}
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return fmt.Errorf("chunkstore: bad ref name %q: byte %d is not printable ASCII", name, i)
		}
	}
	return nil
}
