package cowfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

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
	// maxLeafRefs bounds the chunk refs of one file leaf object, so that a
	// write into a huge file rewrites one leaf, not the whole chunk list.
	maxLeafRefs = 1024
	maxNameLen  = 4096
	maxXattrs   = 1 << 16
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
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	b := []byte(dirMagic)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for i := range entries {
		e := &entries[i]
		if !validName(e.Name) || (i > 0 && entries[i-1].Name == e.Name) {
			return nil, nil, fmt.Errorf("encode directory: bad or duplicate name %q", e.Name)
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
		xs := e.Xattrs
		sort.Slice(xs, func(i, j int) bool { return xs[i].Name < xs[j].Name })
		b = binary.AppendUvarint(b, uint64(len(xs)))
		for _, x := range xs {
			b = appendString(b, x.Name)
			b = appendString(b, string(x.Value))
		}
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
	d := &decoder{b: payload, off: len(dirMagic)}
	n := d.uvarint("entry count")
	// Each entry takes at least 14 bytes: bound the count by the payload.
	if d.err == nil && n > uint64(len(payload)) {
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
		e.Target = d.str("symlink target", maxNameLen)
		e.Rdev = d.uvarint("rdev")
		e.LinkID = d.uvarint("link id")
		e.Nlink = d.u32("nlink")
		nx := d.uvarint("xattr count")
		if d.err == nil && (nx > maxXattrs || nx > uint64(len(payload)-d.off)) {
			d.fail("xattr count out of range")
		}
		for j := uint64(0); j < nx && d.err == nil; j++ {
			var x Xattr
			x.Name = d.str("xattr name", 255)
			x.Value = []byte(d.str("xattr value", 1<<16))
			if d.err == nil && len(e.Xattrs) > 0 && e.Xattrs[len(e.Xattrs)-1].Name >= x.Name {
				d.fail("xattr names out of order")
			}
			e.Xattrs = append(e.Xattrs, x)
		}
		entries = append(entries, e)
	}
	if err := d.finish(len(links), li); err != nil {
		return nil, err
	}
	return entries, nil
}

// fileIndex is one leaf of a file object's index form.
type fileLeaf struct {
	id    chunkstore.ID
	bytes int64
	nrefs int
}

// encodeFileLeaf encodes a run of chunk refs: links are the non-hole chunk
// ids in order; the payload lists sizes and hole flags.
func encodeFileLeaf(refs []chunkstore.Ref) (links []chunkstore.ID, payload []byte) {
	var total int64
	for _, r := range refs {
		total += int64(r.Size)
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
	refs   []chunkstore.Ref // leaf form
	leaves []fileLeaf       // index form
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
		h.refs = make([]chunkstore.Ref, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			sz := d.u32("chunk size")
			hole := d.byte1("hole flag")
			var r chunkstore.Ref
			r.Size = sz
			switch {
			case d.err != nil:
			case hole > 1:
				d.fail("bad hole flag")
			case hole == 0:
				r.ID = d.link(links, &li, "chunk id")
			}
			sum += uint64(sz)
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
			if sum+bytes < sum {
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
func putFile(s nodeStore, refs []chunkstore.Ref) (chunkstore.ID, error) {
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
			n += int64(r.Size)
		}
		leaves = append(leaves, fileLeaf{id: id, bytes: n, nrefs: len(part)})
	}
	l, p := encodeFileIndex(leaves)
	return s.PutNode(l, p)
}

// getFile loads the chunk list of a file object.
func getFile(s nodeStore, id chunkstore.ID) ([]chunkstore.Ref, int64, error) {
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
	var refs []chunkstore.Ref
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
