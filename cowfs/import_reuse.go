package cowfs

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// The import index lets Import of a directory it imported before skip
// reading the regular files that did not change since. It is kept per
// directory under root/imports and holds, for each regular file of the
// last import, its lstat data (device, inode, mode, owner, size, mtime and
// ctime in nanoseconds) and what the import stored for it (file object,
// size, user.* attributes).
//
// A file is reused only when every one of those stat fields is the same
// and its ctime and mtime are older than the moment the last import
// began, less a margin for the coarse clock file times are taken from:
// any change to a file after that moment (a write, touch -r, chmod, a
// rename, a new file on a reused inode) gives it a ctime at or after it,
// so such a file is read again, as git does with racily clean entries.
// An index that is missing, unreadable, damaged (it carries a SHA-256 of
// itself) or made for another path, and a reused file object the store no
// longer has, all mean the file is read as without an index: never a
// wrong import, at worst a full one.

// importIndexMagic starts every import index file (format version 1).
const importIndexMagic = "tineimp1"

// racyMargin is how far before the last import's start a file's ctime and
// mtime must be for it to be reused: more than the tick of the coarse
// clock the kernel stamps file times with.
const racyMargin = 50 * time.Millisecond

// maxImportIndex bounds the size of an index file read back.
const maxImportIndex = 256 << 20

// fileStat is the part of a file's lstat that says it did not change.
type fileStat struct {
	Dev, Ino         uint64
	Mode, UID, GID   uint32
	Size             int64
	MtimeNs, CtimeNs int64
}

func statOf(st *unix.Stat_t) fileStat {
	return fileStat{Dev: st.Dev, Ino: st.Ino, Mode: st.Mode, UID: st.Uid, GID: st.Gid,
		Size: st.Size, MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano()}
}

// indexRec is one regular file of an import index.
type indexRec struct {
	Path   string
	Stat   fileStat
	ID     chunkstore.ID
	Size   int64
	Xattrs []Xattr
}

// importIndex is an import index in memory.
type importIndex struct {
	Dir     string // the directory as given to Import
	StartNs int64  // when the import that wrote it began (realtime)
	Recs    []indexRec
}

// importReuse is the index of the previous import of one directory and
// the one being built by the current import.
type importReuse struct {
	f      *FS
	path   string // the index file
	prev   map[string]*indexRec
	before int64      // reuse only files with ctime and mtime before this
	mu     sync.Mutex // guards next and read: a walk notes files from several goroutines
	next   importIndex
	read   int // regular files read rather than reused
}

// importIndexPath is the index file for directory dir.
func (f *FS) importIndexPath(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(f.root, "imports", hex.EncodeToString(sum[:16]))
}

// loadImportReuse reads the index of the last import of dir, if any, and
// starts the one for this import. It never fails: without a usable index
// every file is read.
func (f *FS) loadImportReuse(dir string, start time.Time) *importReuse {
	r := &importReuse{f: f, path: f.importIndexPath(dir), next: importIndex{Dir: dir, StartNs: start.UnixNano()}}
	b, err := readBounded(r.path, maxImportIndex)
	if err != nil {
		return r
	}
	ix, err := decodeImportIndex(b)
	if err != nil || ix.Dir != dir {
		return r
	}
	r.prev = make(map[string]*indexRec, len(ix.Recs))
	for i := range ix.Recs {
		r.prev[ix.Recs[i].Path] = &ix.Recs[i]
	}
	r.before = ix.StartNs - int64(racyMargin)
	return r
}

func readBounded(path string, max int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(fh.Fd()), &st); err != nil {
		return nil, err
	}
	if st.Size > max {
		return nil, errors.New("import index too large")
	}
	b := make([]byte, st.Size)
	n, err := fh.ReadAt(b, 0)
	if n != len(b) {
		return nil, err
	}
	return b, nil
}

// reuse fills in e from the previous import if the regular file at path,
// with lstat st, is unchanged since; it reports whether it did.
func (r *importReuse) reuse(path string, st *unix.Stat_t, e *Entry) bool {
	if r == nil || r.prev == nil {
		return false
	}
	p := r.prev[path]
	if p == nil {
		return false
	}
	s := statOf(st)
	if s != p.Stat || s.CtimeNs >= r.before || s.MtimeNs >= r.before {
		return false
	}
	if !r.f.store.Has(p.ID) { // also keeps it from a GC running meanwhile
		return false
	}
	e.ID, e.Size, e.Xattrs = p.ID, p.Size, p.Xattrs
	r.note(path, st, e, false)
	return true
}

// note records a regular file of this import, read or reused.
func (r *importReuse) note(path string, st *unix.Stat_t, e *Entry, read bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if read {
		r.read++
	}
	r.next.Recs = append(r.next.Recs, indexRec{Path: path, Stat: statOf(st), ID: e.ID, Size: e.Size, Xattrs: e.Xattrs})
}

// save writes this import's index in place of the previous one (a temp
// file renamed over it), unless nothing changed. Objects it names are
// durable already (the snapshot is kept). A failure only costs the next
// import its reuse, so it is not reported.
func (r *importReuse) save() {
	if r == nil || (r.read == 0 && r.prev != nil && len(r.prev) == len(r.next.Recs)) {
		return
	}
	dir := filepath.Dir(r.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return
	}
	_, err = tmp.Write(encodeImportIndex(&r.next))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), r.path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
}

// encodeImportIndex lays an index out as: magic, start time, directory,
// record count, records, then the SHA-256 of all of it. Integers are
// little-endian; strings and values are length-prefixed.
func encodeImportIndex(ix *importIndex) []byte {
	b := []byte(importIndexMagic)
	b = binary.LittleEndian.AppendUint64(b, uint64(ix.StartNs))
	b = appendBytes(b, []byte(ix.Dir))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ix.Recs)))
	for i := range ix.Recs {
		r := &ix.Recs[i]
		b = appendBytes(b, []byte(r.Path))
		s := r.Stat
		for _, v := range []uint64{s.Dev, s.Ino, uint64(s.Size), uint64(s.MtimeNs), uint64(s.CtimeNs), uint64(r.Size)} {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		for _, v := range []uint32{s.Mode, s.UID, s.GID} {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
		b = append(b, r.ID[:]...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Xattrs)))
		for _, x := range r.Xattrs {
			b = appendBytes(b, []byte(x.Name))
			b = appendBytes(b, x.Value)
		}
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func appendBytes(b, s []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

var errBadImportIndex = errors.New("import index damaged")

// decodeImportIndex parses an index file, checking its sum and every
// length against what is left, so that no input makes it allocate more
// than about the input's size.
func decodeImportIndex(b []byte) (*importIndex, error) {
	if len(b) < len(importIndexMagic)+sha256.Size || string(b[:len(importIndexMagic)]) != importIndexMagic {
		return nil, errBadImportIndex
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if want := sha256.Sum256(body); !bytes.Equal(want[:], sum) {
		return nil, errBadImportIndex
	}
	d := idxDecoder{b: body[len(importIndexMagic):]}
	ix := &importIndex{StartNs: int64(d.u64()), Dir: string(d.bytes())}
	n := d.u32()
	// A record takes at least 4+48+12+32+4 bytes: bound the count by that.
	const minRec = 100
	if d.err != nil || uint64(n) > uint64(len(d.b))/minRec {
		return nil, errBadImportIndex
	}
	ix.Recs = make([]indexRec, n)
	for i := range ix.Recs {
		r := &ix.Recs[i]
		r.Path = string(d.bytes())
		s := &r.Stat
		s.Dev, s.Ino = d.u64(), d.u64()
		s.Size, s.MtimeNs, s.CtimeNs, r.Size = int64(d.u64()), int64(d.u64()), int64(d.u64()), int64(d.u64())
		s.Mode, s.UID, s.GID = d.u32(), d.u32(), d.u32()
		copy(r.ID[:], d.take(len(r.ID)))
		nx := d.u32()
		if d.err != nil || uint64(nx) > uint64(len(d.b))/8 {
			return nil, errBadImportIndex
		}
		for j := uint32(0); j < nx; j++ {
			name, val := string(d.bytes()), d.bytes()
			if d.err != nil {
				return nil, errBadImportIndex
			}
			r.Xattrs = append(r.Xattrs, Xattr{Name: name, Value: bytes.Clone(val)})
		}
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errBadImportIndex
	}
	return ix, nil
}

type idxDecoder struct {
	b   []byte
	err error
}

func (d *idxDecoder) take(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		d.err = errBadImportIndex
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *idxDecoder) u64() uint64 {
	if d.err != nil || len(d.b) < 8 {
		d.err = errBadImportIndex
		return 0
	}
	return binary.LittleEndian.Uint64(d.take(8))
}

func (d *idxDecoder) u32() uint32 {
	if d.err != nil || len(d.b) < 4 {
		d.err = errBadImportIndex
		return 0
	}
	return binary.LittleEndian.Uint32(d.take(4))
}

func (d *idxDecoder) bytes() []byte {
	n := d.u32()
	if d.err != nil || uint64(n) > uint64(len(d.b)) {
		d.err = errBadImportIndex
		return nil
	}
	return d.take(int(n))
}

// reused returns the node of entry name, with lstat st, when it is a
// regular file unchanged since the last import, without opening it; nil
// otherwise (walk then looks at the entry as usual).
func (im *importer) reused(name, path string, st *unix.Stat_t) *importNode {
	if im.reuse == nil || im.reuse.prev == nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		return nil
	}
	n := &importNode{devino: [2]uint64{st.Dev, st.Ino}}
	n.e = Entry{Name: name, Type: TypeFile, Mode: st.Mode & 07777, UID: st.Uid, GID: st.Gid, MtimeNs: st.Mtim.Nano(), Nlink: 1}
	if !im.reuse.reuse(path, st, &n.e) {
		return nil
	}
	return n
}
