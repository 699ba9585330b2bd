package cowfs

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// TarOptions says what WriteTar carries.
type TarOptions struct {
	DiffOptions
	// Privileges says which privileges the archive may carry. The zero
	// value carries none: setuid and setgid bits are cleared, device
	// nodes are left out, and every entry belongs to the exporting user.
	Privileges HostPrivileges
}

// TarResult is what WriteTar reports besides the archive.
type TarResult struct {
	Deleted []string  // every path deleted from a to b
	Refused []Refusal // entries and xattrs left out of the archive
}

// whiteoutPrefix marks a deleted name in an archive (OCI image layers).
const whiteoutPrefix = ".wh."

// WriteTar writes the changes from a to b (as DiffWith with
// opts.DiffOptions lists them) as a PAX tar stream, in an order no
// extractor can be led through a symlink by (see docs/export.md):
//
//   - each deleted path is marked by an OCI whiteout, an empty file
//     dir/.wh.name; a deleted directory's whiteout covers its contents;
//   - a path whose type changed gets a whiteout, then its new entry;
//   - added and changed directories, files and fifos follow in diff order,
//     files with holes in GNU sparse format 1.0, holes kept as holes;
//   - symlinks come last, and no entry lies below a symlink.
//
// Only user.* xattrs are carried. What the archive leaves out (devices
// and sockets under the default privileges, names that would read as
// whiteouts, other xattrs) is returned in Refused. Memory stays bounded:
// file content is streamed, holes are never read.
func (f *FS) WriteTar(ctx context.Context, w io.Writer, a, b SnapshotID, opts TarOptions) (*TarResult, error) {
	changes, err := f.DiffWith(ctx, a, b, opts.DiffOptions)
	if err != nil {
		return nil, err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	t := &tarWriter{f: f, w: bw, tw: tar.NewWriter(bw), priv: opts.Privileges, uid: os.Getuid(), gid: os.Getgid(), res: &TarResult{}}
	var links []Change
	cover := "" // prefix of the deleted paths a whiteout above covers
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if c.Path == "" {
			if c.Kind == ModeChanged {
				t.refuse("", "top directory metadata changed; an archive of changes does not carry it")
			}
			continue
		}
		if c.Kind == Deleted && cover != "" && strings.HasPrefix(c.Path, cover) {
			t.res.Deleted = append(t.res.Deleted, c.Path)
			continue
		}
		cover = ""
		if c.Kind == Deleted || c.Kind == TypeChanged {
			if c.Kind == Deleted {
				t.res.Deleted = append(t.res.Deleted, c.Path)
			}
			if err := t.whiteout(c.Path); err != nil {
				return nil, err
			}
			if c.Old.Type == TypeDir {
				cover = c.Path + "/"
			}
			if c.Kind == Deleted {
				continue
			}
		}
		if strings.HasPrefix(nameAt(c.Path), whiteoutPrefix) {
			t.refuse(c.Path, "the name begins with "+whiteoutPrefix+", which marks a deletion in this format")
			continue
		}
		if r := opts.Privileges.refuse(c.New); r != "" {
			t.refuse(c.Path, r)
			continue
		}
		if c.New.Type == TypeSymlink {
			if strings.ContainsRune(c.New.Target, 0) {
				t.refuse(c.Path, "the symlink's target holds a NUL byte, which no file system's symlink can")
				continue
			}
			links = append(links, c)
			continue
		}
		if err := t.entry(c.Path, c.New); err != nil {
			return nil, err
		}
	}
	for _, c := range links {
		if err := t.entry(c.Path, c.New); err != nil {
			return nil, err
		}
	}
	if err := t.tw.Close(); err != nil {
		return nil, fmt.Errorf("write tar: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("write tar: %w", err)
	}
	return t.res, nil
}

type tarWriter struct {
	f        *FS
	w        *bufio.Writer
	tw       *tar.Writer
	priv     HostPrivileges
	uid, gid int
	res      *TarResult
}

func (t *tarWriter) refuse(p, reason string) {
	t.res.Refused = append(t.res.Refused, Refusal{Path: p, Reason: reason})
}

func (t *tarWriter) whiteout(p string) error {
	dir, name := p[:len(p)-len(nameAt(p))], nameAt(p)
	h := &tar.Header{Typeflag: tar.TypeReg, Name: dir + whiteoutPrefix + name, Mode: 0o644, Uid: t.uid, Gid: t.gid, Format: tar.FormatPAX}
	if err := t.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("write tar whiteout for %q: %w", p, err)
	}
	return nil
}

// owner is the uid and gid e gets in the archive.
func (t *tarWriter) owner(e *Entry) (int, int) {
	if t.priv.Owners {
		return int(e.UID), int(e.GID)
	}
	return t.uid, t.gid
}

// xattrRecords are the PAX records of e's user xattrs; the others are
// refused.
func (t *tarWriter) xattrRecords(p string, e *Entry) map[string]string {
	var recs map[string]string
	for _, x := range e.Xattrs {
		if !strings.HasPrefix(x.Name, "user.") {
			t.refuse(p, fmt.Sprintf("xattr %q is not carried (an archive carries only user.* xattrs)", x.Name))
			continue
		}
		if strings.ContainsAny(x.Name, "=\x00") {
			t.refuse(p, fmt.Sprintf("xattr %q is not carried (a tar record's name cannot hold = or NUL)", x.Name))
			continue
		}
		if recs == nil {
			recs = map[string]string{}
		}
		recs["SCHILY.xattr."+x.Name] = string(x.Value)
	}
	return recs
}

func (t *tarWriter) entry(p string, e *Entry) error {
	var refs []fileRun
	if e.Type == TypeFile && e.Size > 0 {
		var err error
		if refs, err = t.f.fileRuns(e); err != nil {
			return err
		}
		if len(refs) != 1 || refs[0].hole {
			return t.sparse(p, e, refs)
		}
	}
	uid, gid := t.owner(e)
	h := &tar.Header{
		Name:       p,
		Mode:       int64(t.priv.hostMode(e, 0)),
		Uid:        uid,
		Gid:        gid,
		ModTime:    time.Unix(0, e.MtimeNs),
		Format:     tar.FormatPAX,
		PAXRecords: t.xattrRecords(p, e),
	}
	switch e.Type {
	case TypeDir:
		h.Typeflag, h.Name = tar.TypeDir, p+"/"
	case TypeSymlink:
		h.Typeflag, h.Linkname = tar.TypeSymlink, e.Target
	case TypeFifo:
		h.Typeflag = tar.TypeFifo
	case TypeChar, TypeBlock:
		h.Typeflag = tar.TypeChar
		if e.Type == TypeBlock {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor = int64((e.Rdev >> 8) & 0xfff)
		h.Devminor = int64((e.Rdev & 0xff) | ((e.Rdev >> 12) & 0xfff00))
	default:
		h.Typeflag = tar.TypeReg
		h.Size = e.Size
	}
	if err := t.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("write tar header for %q: %w", p, err)
	}
	if h.Size > 0 {
		r, err := t.f.contentReader(e)
		if err != nil {
			return err
		}
		if _, err := io.Copy(t.tw, r); err != nil {
			return fmt.Errorf("write tar body of %q: %w", p, err)
		}
	}
	return nil
}

// fileRun is one run of a file: data or a hole.
type fileRun struct {
	off, n int64
	hole   bool
}

// fileRuns lists e's content as alternating runs of data and holes.
func (f *FS) fileRuns(e *Entry) ([]fileRun, error) {
	refs, size, err := getFile(f.store, e.ID)
	if err != nil {
		return nil, err
	}
	if size != e.Size {
		return nil, fmt.Errorf("file object %s: %w: holds %d bytes, its entry says %d", e.ID, errCorrupt, size, e.Size)
	}
	var runs []fileRun
	var off int64
	for _, r := range refs {
		hole := r.ID.IsZero()
		if n := len(runs); n > 0 && runs[n-1].hole == hole {
			runs[n-1].n += int64(r.Size)
		} else {
			runs = append(runs, fileRun{off: off, n: int64(r.Size), hole: hole})
		}
		off += int64(r.Size)
	}
	return runs, nil
}

// sparse writes a file with holes in GNU sparse format 1.0, which
// archive/tar cannot write: a PAX header with GNU.sparse.major=1,
// minor=0, name and realsize, then a ustar header under a stand-in name
// whose data is the sparse map (the count of data runs, then offset and
// length of each, one decimal number a line, padded to a block) followed
// by the data runs. Runs are widened to whole 512-byte blocks (GNU tar
// reads each run block by block; other readers read them back to back, so
// only block-sized runs read the same everywhere). A file ending in a
// hole ends its map with a run of length 0 at the end of the file.
func (t *tarWriter) sparse(p string, e *Entry, runs []fileRun) error {
	var blocks []fileRun
	for _, r := range runs {
		if r.hole {
			continue
		}
		start, end := r.off&^511, min(blockRound(r.off+r.n), e.Size)
		if n := len(blocks); n > 0 && start <= blocks[n-1].off+blocks[n-1].n {
			blocks[n-1].n = end - blocks[n-1].off
			continue
		}
		blocks = append(blocks, fileRun{off: start, n: end - start})
	}
	var m strings.Builder
	var data int64
	for _, r := range blocks {
		fmt.Fprintf(&m, "%d\n%d\n", r.off, r.n)
		data += r.n
	}
	nmap := len(blocks)
	if n := len(blocks); n == 0 || blocks[n-1].off+blocks[n-1].n < e.Size {
		fmt.Fprintf(&m, "%d\n0\n", e.Size)
		nmap++
	}
	sparseMap := strconv.Itoa(nmap) + "\n" + m.String()
	mapLen := blockRound(int64(len(sparseMap)))

	recs := t.xattrRecords(p, e)
	if recs == nil {
		recs = map[string]string{}
	}
	recs["GNU.sparse.major"] = "1"
	recs["GNU.sparse.minor"] = "0"
	recs["GNU.sparse.name"] = p
	recs["GNU.sparse.realsize"] = strconv.FormatInt(e.Size, 10)
	if ns := e.MtimeNs % 1e9; ns != 0 {
		recs["mtime"] = strings.TrimRight(fmt.Sprintf("%d.%09d", e.MtimeNs/1e9, ns), "0")
	}
	var pax []byte
	for _, k := range sortedKeys(recs) {
		pax = appendPAXRecord(pax, k, recs[k])
	}
	if err := t.tw.Flush(); err != nil {
		return fmt.Errorf("write tar header for %q: %w", p, err)
	}
	uid, gid := t.owner(e)
	mtime := e.MtimeNs / 1e9
	if e.MtimeNs < 0 && e.MtimeNs%1e9 != 0 {
		mtime--
	}
	t.w.Write(ustarHeader("PaxHeaders.0/GNUSparseFile", 'x', int64(len(pax)), 0o644, uid, gid, mtime))
	t.w.Write(pax)
	t.w.Write(make([]byte, blockRound(int64(len(pax)))-int64(len(pax))))
	t.w.Write(ustarHeader("GNUSparseFile.0/"+sanitizeStandIn(nameAt(p)), tar.TypeReg, mapLen+data, int64(t.priv.hostMode(e, 0)), uid, gid, mtime))
	t.w.WriteString(sparseMap)
	t.w.Write(make([]byte, mapLen-int64(len(sparseMap))))
	c, err := t.f.contentReader(e)
	if err != nil {
		return err
	}
	rs := c.(io.ReadSeeker)
	for _, r := range blocks {
		if _, err := rs.Seek(r.off, io.SeekStart); err != nil {
			return fmt.Errorf("write tar body of %q: %w", p, err)
		}
		if _, err := io.CopyN(t.w, rs, r.n); err != nil {
			return fmt.Errorf("write tar body of %q: %w", p, err)
		}
	}
	if _, err := t.w.Write(make([]byte, blockRound(data)-data)); err != nil {
		return fmt.Errorf("write tar body of %q: %w", p, err)
	}
	return nil
}

// sanitizeStandIn keeps the stand-in name of a sparse entry (what an
// extractor that does not know the format creates) short and printable.
func sanitizeStandIn(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c < 0x21 || c >= 0x7f {
			b[i] = '_'
		}
	}
	return string(b[:min(len(b), 80)])
}

func blockRound(n int64) int64 { return (n + 511) &^ 511 }

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// appendPAXRecord appends "LEN key=value\n", LEN counting the whole
// record including its own digits.
func appendPAXRecord(b []byte, k, v string) []byte {
	n := len(k) + len(v) + 3 // ' ', '=', '\n'
	total := n + len(strconv.Itoa(n))
	if len(strconv.Itoa(total)) != len(strconv.Itoa(n)) {
		total++
	}
	return fmt.Appendf(b, "%d %s=%s\n", total, k, v)
}

// ustarHeader builds one 512-byte ustar header block.
func ustarHeader(name string, typeflag byte, size, mode int64, uid, gid int, mtime int64) []byte {
	h := make([]byte, 512)
	copy(h[0:100], name)
	putNumeric(h[100:108], mode)
	putNumeric(h[108:116], int64(uid))
	putNumeric(h[116:124], int64(gid))
	putNumeric(h[124:136], size)
	putNumeric(h[136:148], mtime)
	h[156] = typeflag
	copy(h[257:263], "ustar\x00")
	copy(h[263:265], "00")
	copy(h[148:156], "        ")
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:155], fmt.Sprintf("%06o\x00", sum))
	return h
}

// putNumeric writes v into a ustar number field: octal digits and a NUL
// when they fit, else GNU's base-256 form (high bit set, big-endian),
// which GNU tar, bsdtar, Python and Go all read.
func putNumeric(f []byte, v int64) {
	if v >= 0 && v < 1<<(3*(len(f)-1)) {
		copy(f, fmt.Sprintf("%0*o\x00", len(f)-1, v))
		return
	}
	for i := len(f) - 1; i > 0; i-- {
		f[i] = byte(v)
		v >>= 8
	}
	f[0] = 0x80
}
