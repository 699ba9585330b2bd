package cowfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"syscall"

	"tine/chunkstore"
)

// EntryType is the kind of a directory entry.
type EntryType uint8

// The kinds of directory entries a tree holds.
const (
	TypeFile EntryType = iota + 1
	TypeDir
	TypeSymlink
	TypeFifo
	TypeChar
	TypeBlock
	TypeSocket
)

var typeNames = [...]string{"", "file", "dir", "symlink", "fifo", "char", "block", "socket"}

// String names the type ("file", "dir", ...).
func (t EntryType) String() string {
	if int(t) < len(typeNames) && t != 0 {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Xattr is one extended attribute of an entry.
type Xattr struct {
	Name  string
	Value []byte
}

// Entry is one name in a directory object. Entries are immutable once
// encoded; a change to a file or subtree yields a new ID and new
// directory objects up to the root.
type Entry struct {
	Name    string
	Type    EntryType
	Mode    uint32 // permission bits with setuid, setgid and sticky (07777)
	UID     uint32
	GID     uint32
	MtimeNs int64         // modification time, nanoseconds since the Unix epoch
	Size    int64         // file length; for symlinks the target length
	ID      chunkstore.ID // file: content object (zero when empty); dir: tree object
	Target  string        // symlink target
	Rdev    uint64        // device number of char and block nodes
	LinkID  uint64        // nonzero: the entry is one name of a hard-linked file
	Nlink   uint32        // names of a hard-linked file (1 when LinkID is zero)
	Xattrs  []Xattr
}

const (
	dirMagic  = "tcD1"
	fileMagic = "tcF1"
)

var errCorrupt = errors.New("corrupt object")

// sameContent reports whether two entries have identical type and content
// (metadata aside).
func sameContent(a, b *Entry) bool {
	return a.Type == b.Type && a.ID == b.ID && a.Size == b.Size && a.Target == b.Target && a.Rdev == b.Rdev
}

// sameMeta reports whether two entries have identical metadata.
func sameMeta(a, b *Entry) bool {
	if a.Mode != b.Mode || a.UID != b.UID || a.GID != b.GID || len(a.Xattrs) != len(b.Xattrs) {
		return false
	}
	for i := range a.Xattrs {
		if a.Xattrs[i].Name != b.Xattrs[i].Name || string(a.Xattrs[i].Value) != string(b.Xattrs[i].Value) {
			return false
		}
	}
	return true
}

func validName(n string) bool {
	return n != "" && n != "." && n != ".." && len(n) <= maxNameLen && !strings.ContainsAny(n, "/\x00")
}

// encodeDir encodes entries (sorted here by name) as a directory object:
// the links are the non-zero IDs in entry order, the payload the rest.
func encodeDir(entries []Entry) (links []chunkstore.ID, payload []byte, err error) {
	if len(entries) > maxDirEntries {
		return nil, nil, fmt.Errorf("encode directory: %w", limitErr(syscall.ENOSPC, "%d entries, at most %d", len(entries), maxDirEntries))
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	b := []byte(dirMagic)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for i := range entries {
		e := &entries[i]
		sort.Slice(e.Xattrs, func(i, j int) bool { return e.Xattrs[i].Name < e.Xattrs[j].Name })
		if err := checkEntry(e); err != nil {
			return nil, nil, fmt.Errorf("encode directory: %w", err)
		}
		if i > 0 && entries[i-1].Name == e.Name {
			return nil, nil, fmt.Errorf("encode directory: duplicate name %q", e.Name)
		}
		b = appendString(b, e.Name)
		b = append(b, byte(e.Type))
		hasID := !e.ID.IsZero()
		if e.Type == TypeDir && !hasID {
			return nil, nil, fmt.Errorf("encode directory: subdirectory %q has no tree id", e.Name)
		}
		if hasID {
			b = append(b, 1)
			links = append(links, e.ID)
		} else {
			b = append(b, 0)
		}
		b = binary.AppendUvarint(b, uint64(e.Mode&07777))
		b = binary.AppendUvarint(b, uint64(e.UID))
		b = binary.AppendUvarint(b, uint64(e.GID))
		b = binary.AppendVarint(b, e.MtimeNs)
		b = binary.AppendUvarint(b, uint64(e.Size))
		b = appendString(b, e.Target)
		b = binary.AppendUvarint(b, e.Rdev)
		b = binary.AppendUvarint(b, e.LinkID)
		b = binary.AppendUvarint(b, uint64(e.Nlink))
		b = binary.AppendUvarint(b, uint64(len(e.Xattrs)))
		for _, x := range e.Xattrs {
			b = appendString(b, x.Name)
			b = appendString(b, string(x.Value))
		}
	}
	if n := len(b) + len(links)*len(chunkstore.ID{}); n > maxDirBytes {
		return nil, nil, fmt.Errorf("encode directory: %w", limitErr(syscall.ENOSPC, "object of %d bytes, at most %d", n, maxDirBytes))
	}
	return links, b, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads the fields of an object payload and remembers the first
// error with the offset at which it happened.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s at offset %d", errCorrupt, what, d.off)
	}
}

// finish returns the decoder's error, or an error if bytes or links are
// left over after decoding (li links of nLinks used).
func (d *decoder) finish(nLinks, li int) error {
	switch {
	case d.err != nil:
		return d.err
	case d.off != len(d.b):
		return fmt.Errorf("%w: %d trailing bytes at offset %d", errCorrupt, len(d.b)-d.off, d.off)
	case li != nLinks:
		return fmt.Errorf("%w: %d links, %d used", errCorrupt, nLinks, li)
	}
	return nil
}

// link takes the next id from links for a field that names one: it must
// exist and not be zero.
func (d *decoder) link(links []chunkstore.ID, li *int, what string) chunkstore.ID {
	switch {
	case *li >= len(links):
		d.fail("more " + what + "s than links")
	case links[*li].IsZero():
		d.fail("zero " + what + " in links")
	default:
		*li++
		return links[*li-1]
	}
	return chunkstore.ID{}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 || n != uvarintLen(v) {
		d.fail("bad " + what)
		return 0
	}
	d.off += n
	return v
}

// uvarintLen is the length of v's canonical (shortest) encoding; longer
// encodings are rejected so that an object has exactly one encoding.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b[d.off:])
	if n <= 0 || n != len(binary.AppendVarint(nil, v)) {
		d.fail("bad " + what)
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) byte1(what string) byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.b) {
		d.fail("truncated " + what)
		return 0
	}
	v := d.b[d.off]
	d.off++
	return v
}

func (d *decoder) str(what string, max int) string {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(max) || n > uint64(len(d.b)-d.off) {
		d.fail(what + " length out of range")
		return ""
	}
	s := string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}

func (d *decoder) u32(what string) uint32 {
	v := d.uvarint(what)
	if v > math.MaxUint32 {
		d.fail(what + " out of range")
	}
	return uint32(v)
}

// decodeDir decodes a directory object. It never panics: damaged input
// yields an error naming the offset.
func decodeDir(links []chunkstore.ID, payload []byte) ([]Entry, error) {
	if len(payload) < len(dirMagic) || string(payload[:len(dirMagic)]) != dirMagic {
		return nil, fmt.Errorf("%w: not a directory object (bad magic)", errCorrupt)
	}
	if n := len(payload) + len(links)*len(chunkstore.ID{}); n > maxDirBytes {
		return nil, fmt.Errorf("%w: directory object of %d bytes, at most %d", errCorrupt, n, maxDirBytes)
	}
	d := &decoder{b: payload, off: len(dirMagic)}
	n := d.uvarint("entry count")
	// Each entry takes at least 14 bytes: bound the count by the payload.
	if d.err == nil && (n > uint64(len(payload)) || n > maxDirEntries) {
		d.fail("entry count out of range")
	}
	if d.err != nil {
		return nil, d.err
	}
	entries := make([]Entry, 0, n)
	li := 0
	for i := uint64(0); i < n && d.err == nil; i++ {
		var e Entry
		e.Name = d.str("name", maxNameLen)
		if d.err == nil && !validName(e.Name) {
			d.fail(fmt.Sprintf("invalid name %q", e.Name))
		}
		if d.err == nil && len(entries) > 0 && entries[len(entries)-1].Name >= e.Name {
			d.fail(fmt.Sprintf("names out of order at %q", e.Name))
		}
		e.Type = EntryType(d.byte1("type"))
		if d.err == nil && (e.Type < TypeFile || e.Type > TypeSocket) {
			d.fail(fmt.Sprintf("unknown entry type %d", e.Type))
		}
		hasID := d.byte1("id flag")
		switch {
		case d.err != nil:
		case hasID > 1:
			d.fail("bad id flag")
		case hasID == 1:
			e.ID = d.link(links, &li, "id")
		case e.Type == TypeDir:
			d.fail("subdirectory without tree id")
		}
		if d.err == nil && hasID == 1 && e.Type != TypeFile && e.Type != TypeDir {
			d.fail("id on an entry that holds no content")
		}
		mode := d.uvarint("mode")
		if mode > 07777 {
			d.fail("mode out of range")
		}
		e.Mode = uint32(mode)
		e.UID = d.u32("uid")
		e.GID = d.u32("gid")
		e.MtimeNs = d.varint("mtime")
		size := d.uvarint("size")
		if size > math.MaxInt64 {
			d.fail("size out of range")
		}
		e.Size = int64(size)
		e.Target = d.str("symlink target", maxTargetLen)
		e.Rdev = d.uvarint("rdev")
		e.LinkID = d.uvarint("link id")
		e.Nlink = d.u32("nlink")
		nx := d.uvarint("xattr count")
		if d.err == nil && (nx > maxXattrs || nx > uint64(len(payload)-d.off)) {
			d.fail("xattr count out of range")
		}
		for j := uint64(0); j < nx && d.err == nil; j++ {
			var x Xattr
			x.Name = d.str("xattr name", maxXattrNameLen)
			x.Value = []byte(d.str("xattr value", maxXattrValueLen))
			e.Xattrs = append(e.Xattrs, x)
		}
		if d.err == nil {
			if err := checkEntry(&e); err != nil {
				d.fail(err.Error())
			}
		}
		entries = append(entries, e)
	}
	if err := d.finish(len(links), li); err != nil {
		return nil, err
	}
	return entries, nil
}

// fileRef is one piece of a file: a stored chunk, or with the zero ID a
// hole of Size zero bytes. A hole of any length is one fileRef, so a
// sparse file costs memory and encoding by its pieces, not its size.
type fileRef struct {
	ID   chunkstore.ID
	Size int64
}

// fileRefs converts a chunk list from the store.
func fileRefs(rs []chunkstore.Ref) []fileRef {
	out := make([]fileRef, len(rs))
	for i, r := range rs {
		out[i] = fileRef{ID: r.ID, Size: int64(r.Size)}
	}
	return out
}

// appendHole appends n zero bytes to refs, merging with a hole before it.
func appendHole(refs []fileRef, n int64) []fileRef {
	if n <= 0 {
		return refs
	}
	if k := len(refs); k > 0 && refs[k-1].ID.IsZero() {
		refs[k-1].Size += n
		return refs
	}
	return append(refs, fileRef{Size: n})
}

// fileLeaf is one leaf of a file object's index form.
type fileLeaf struct {
	id    chunkstore.ID
	bytes int64
	nrefs int
}

// encodeFileLeaf encodes a run of chunk refs: links are the non-hole chunk
// ids in order; the payload lists sizes and hole flags.
func encodeFileLeaf(refs []fileRef) (links []chunkstore.ID, payload []byte) {
	var total int64
	for _, r := range refs {
		total += r.Size
	}
	b := []byte(fileMagic)
	b = binary.AppendUvarint(b, uint64(total))
	b = append(b, 0) // leaf form
	b = binary.AppendUvarint(b, uint64(len(refs)))
	for _, r := range refs {
		b = binary.AppendUvarint(b, uint64(r.Size))
		if r.ID.IsZero() {
			b = append(b, 1)
		} else {
			b = append(b, 0)
			links = append(links, r.ID)
		}
	}
	return links, b
}

// encodeFileIndex encodes the index form: links are leaf objects.
func encodeFileIndex(leaves []fileLeaf) (links []chunkstore.ID, payload []byte) {
	var total int64
	for _, l := range leaves {
		total += l.bytes
	}
	b := []byte(fileMagic)
	b = binary.AppendUvarint(b, uint64(total))
	b = append(b, 1) // index form
	b = binary.AppendUvarint(b, uint64(len(leaves)))
	for _, l := range leaves {
		b = binary.AppendUvarint(b, uint64(l.bytes))
		b = binary.AppendUvarint(b, uint64(l.nrefs))
		links = append(links, l.id)
	}
	return links, b
}

// fileHeader is the decoded head of a file object.
type fileHeader struct {
	size   int64
	index  bool
	refs   []fileRef  // leaf form
	leaves []fileLeaf // index form
}

// decodeFile decodes a file object (leaf or index form). It never panics.
func decodeFile(links []chunkstore.ID, payload []byte) (*fileHeader, error) {
	if len(payload) < len(fileMagic) || string(payload[:len(fileMagic)]) != fileMagic {
		return nil, fmt.Errorf("%w: not a file object (bad magic)", errCorrupt)
	}
	d := &decoder{b: payload, off: len(fileMagic)}
	size := d.uvarint("file size")
	if size > math.MaxInt64 {
		d.fail("file size out of range")
	}
	form := d.byte1("form")
	n := d.uvarint("count")
	if d.err == nil && n > uint64(len(payload)) {
		d.fail("count out of range")
	}
	if d.err != nil {
		return nil, d.err
	}
	h := &fileHeader{size: int64(size)}
	var sum uint64
	li := 0
	switch form {
	case 0:
		if d.err == nil && n > maxLeafRefs {
			d.fail("count out of range")
		}
		h.refs = make([]fileRef, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			sz := d.uvarint("piece size")
			hole := d.byte1("hole flag")
			r := fileRef{Size: int64(sz)}
			switch {
			case d.err != nil:
			case hole > 1:
				d.fail("bad hole flag")
			case hole == 0 && sz > maxChunkSize:
				d.fail("chunk size out of range")
			case hole == 0:
				r.ID = d.link(links, &li, "chunk id")
			}
			if sum+sz < sum || sum+sz > maxFileSize {
				d.fail("size overflow")
			}
			sum += sz
			h.refs = append(h.refs, r)
		}
	case 1:
		h.index = true
		for i := uint64(0); i < n && d.err == nil; i++ {
			bytes := d.uvarint("leaf bytes")
			nrefs := d.uvarint("leaf refs")
			if d.err == nil && (bytes > math.MaxInt64 || nrefs > maxLeafRefs) {
				d.fail("leaf out of range")
			}
			if d.err == nil && li >= len(links) {
				d.fail("more leaves than links")
			}
			if d.err != nil {
				break
			}
			h.leaves = append(h.leaves, fileLeaf{id: links[li], bytes: int64(bytes), nrefs: int(nrefs)})
			li++
			if sum+bytes < sum || sum+bytes > maxFileSize {
				d.fail("size overflow")
			}
			sum += bytes
		}
	default:
		d.fail(fmt.Sprintf("unknown file form %d", form))
	}
	if err := d.finish(len(links), li); err != nil {
		return nil, err
	}
	if sum != size {
		return nil, fmt.Errorf("%w: parts sum to %d bytes, header says %d", errCorrupt, sum, size)
	}
	return h, nil
}

// nodeStore is the part of chunkstore a tree needs.
type nodeStore interface {
	PutNode(links []chunkstore.ID, payload []byte) (chunkstore.ID, error)
	GetNode(id chunkstore.ID) ([]chunkstore.ID, []byte, error)
}

// putFile stores a chunk list as a file object and returns its id; an
// empty list is the zero id.
func putFile(s nodeStore, refs []fileRef) (chunkstore.ID, error) {
	if len(refs) == 0 {
		return chunkstore.ID{}, nil
	}
	if len(refs) <= maxLeafRefs {
		l, p := encodeFileLeaf(refs)
		return s.PutNode(l, p)
	}
	var leaves []fileLeaf
	for i := 0; i < len(refs); i += maxLeafRefs {
		part := refs[i:min(i+maxLeafRefs, len(refs))]
		l, p := encodeFileLeaf(part)
		id, err := s.PutNode(l, p)
		if err != nil {
			return chunkstore.ID{}, err
		}
		var n int64
		for _, r := range part {
			n += r.Size
		}
		leaves = append(leaves, fileLeaf{id: id, bytes: n, nrefs: len(part)})
	}
	l, p := encodeFileIndex(leaves)
	return s.PutNode(l, p)
}

// getFile loads the chunk list of a file object.
func getFile(s nodeStore, id chunkstore.ID) ([]fileRef, int64, error) {
	if id.IsZero() {
		return nil, 0, nil
	}
	links, payload, err := s.GetNode(id)
	if err != nil {
		return nil, 0, fmt.Errorf("read file object %s: %w", id, err)
	}
	h, err := decodeFile(links, payload)
	if err != nil {
		return nil, 0, fmt.Errorf("file object %s: %w", id, err)
	}
	if !h.index {
		return h.refs, h.size, nil
	}
	var refs []fileRef
	for _, lf := range h.leaves {
		ll, lp, err := s.GetNode(lf.id)
		if err != nil {
			return nil, 0, fmt.Errorf("read file leaf %s of %s: %w", lf.id, id, err)
		}
		lh, err := decodeFile(ll, lp)
		if err != nil {
			return nil, 0, fmt.Errorf("file leaf %s of %s: %w", lf.id, id, err)
		}
		if lh.index || lh.size != lf.bytes || len(lh.refs) != lf.nrefs {
			return nil, 0, fmt.Errorf("file leaf %s of %s: %w: leaf does not match its index entry", lf.id, id, errCorrupt)
		}
		refs = append(refs, lh.refs...)
	}
	return refs, h.size, nil
}

// putDir stores a directory object.
func putDir(s nodeStore, entries []Entry) (chunkstore.ID, error) {
	l, p, err := encodeDir(entries)
	if err != nil {
		return chunkstore.ID{}, err
	}
	return s.PutNode(l, p)
}

// getDir loads a directory object's entries, sorted by name.
func getDir(s nodeStore, id chunkstore.ID) ([]Entry, error) {
	links, payload, err := s.GetNode(id)
	if err != nil {
		return nil, fmt.Errorf("read directory object %s: %w", id, err)
	}
	es, err := decodeDir(links, payload)
	if err != nil {
		return nil, fmt.Errorf("directory object %s: %w", id, err)
	}
	return es, nil
}

// fileReader streams the content of a chunk list; holes read as zeros.
// It seeks without reading the chunks it skips.
type fileReader struct {
	s    *chunkstore.Store
	all  []fileRef
	refs []fileRef // the refs after the current one
	pos  int64     // offset of the next byte Read returns
	cur  []byte    // the rest of the current chunk
	hole int64     // the rest of the current hole
}

func newFileReader(s *chunkstore.Store, refs []fileRef) *fileReader {
	return &fileReader{s: s, all: refs, refs: refs}
}

// next makes refs[0] current, skipping its first skip bytes.
func (r *fileReader) next(skip int64) error {
	ref := r.refs[0]
	r.refs = r.refs[1:]
	if ref.ID.IsZero() {
		r.hole = ref.Size - skip
		return nil
	}
	d, err := r.s.View(ref.ID)
	if err != nil {
		return fmt.Errorf("read chunk %s: %w", ref.ID, err)
	}
	if int64(len(d)) != ref.Size {
		return fmt.Errorf("chunk %s: %w: %d bytes, ref says %d", ref.ID, errCorrupt, len(d), ref.Size)
	}
	r.cur = d[skip:]
	return nil
}

func (r *fileReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 && r.hole == 0 {
		if len(r.refs) == 0 {
			return 0, io.EOF
		}
		if err := r.next(0); err != nil {
			return 0, err
		}
	}
	var n int
	if r.hole > 0 {
		n = int(min(int64(len(p)), r.hole))
		clear(p[:n])
		r.hole -= int64(n)
	} else {
		n = copy(p, r.cur)
		r.cur = r.cur[n:]
	}
	r.pos += int64(n)
	return n, nil
}

// Seek sets the offset of the next Read (io.SeekStart or io.SeekCurrent).
// Chunks skipped whole are not read; a seek backwards starts over.
func (r *fileReader) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		off += r.pos
	default:
		return r.pos, fmt.Errorf("cowfs: file reader: seek whence %d not supported", whence)
	}
	if off < 0 {
		return r.pos, fmt.Errorf("cowfs: file reader: seek to %d", off)
	}
	if off < r.pos {
		r.refs, r.pos, r.cur, r.hole = r.all, 0, nil, 0
	}
	skip := off - r.pos
	n := min(skip, int64(len(r.cur)))
	r.cur = r.cur[n:]
	skip -= n
	n = min(skip, r.hole)
	r.hole -= n
	skip -= n
	for skip > 0 && len(r.refs) > 0 {
		if size := r.refs[0].Size; size <= skip {
			r.refs = r.refs[1:]
			skip -= size
			continue
		}
		if err := r.next(skip); err != nil {
			return r.pos, err
		}
		skip = 0
	}
	r.pos = off
	return off, nil
}
