package treecopy

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Options says how Extract sets modes.
type Options struct {
	// KeepSpecial keeps setuid, setgid and sticky bits; without it they are dropped.
	KeepSpecial bool
	// Umask is cleared from every mode made (0 keeps the archive's permission bits).
	Umask uint32
}

// maxDirs is the most directories one archive may make or go through:
// Extract remembers each until the end, to set its mode. A variable for
// the tests.
var maxDirs = 1_000_000

// Bounds on what one Extract keeps.
const (
	// maxOpen is the most directory descriptors Extract keeps open.
	maxOpen = 64
	// holeBlock is the size and alignment of a run of zeros that is
	// left a hole rather than written.
	holeBlock = 4096
)

// Extract reads a tar stream and places its one top entry at name in the
// directory open as parentFD ("" = the top entry's own name). The first
// entry names the top: a directory, regular file or symlink; every later
// one must lie under a directory top. Names that are absolute, hold a
// ".." component or a NUL, or lie outside the top fail the call, as does
// an entry whose way goes through a symlink or a mount point.
//
// The stream must end with tar's end marker: one cut between two entries
// fails like one cut inside an entry. An archive may make or go through
// at most 1,000,000 directories.
//
// A new target is built under a temporary name (.tine-cp-…) and renamed
// into place only once the stream has ended cleanly; on error it is
// removed and name stays absent. An existing directory is merged into:
// its directories are kept as they are, and each file and symlink is
// written under a temporary name beside its final one and renamed over
// it, so an error leaves what was placed before it. An existing file or
// symlink is replaced by a top file or symlink. A directory never
// replaces a non-directory, or the other way round: that is an error.
//
// Hard links, devices, fifos, GNU sparse files and unknown types are
// skipped and counted in Stats.Skipped; symlink targets are written as
// given, since nothing here follows them. Modes lose opts.Umask, and
// setuid, setgid and sticky bits unless opts.KeepSpecial; directories get
// theirs at the end, so a read-only one can still be filled. Owners are
// never changed. Runs of zeros are left holes. Nothing is synced.
func Extract(ctx context.Context, r io.Reader, parentFD int, name string, opts Options) (Stats, error) {
	var st Stats
	if name != "" {
		if err := checkName(name); err != nil {
			return st, fmt.Errorf("extract: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	er := &endReader{r: r}
	x := &extractor{ctx: ctx, opts: opts, st: &st, er: er, tr: tar.NewReader(er), parent: parentFD, root: -1}
	defer x.closePath()
	h, err := x.next()
	if err == io.EOF {
		return st, errors.New("extract: the archive holds no entry; it must hold the file or directory to copy")
	}
	if err != nil {
		return st, fmt.Errorf("extract: %w", err)
	}
	top, err := cleanName(h.Name)
	if err != nil {
		return st, fmt.Errorf("extract: entry %q: %w", h.Name, err)
	}
	if strings.IndexByte(top, '/') >= 0 {
		return st, fmt.Errorf("extract: entry %q: the first entry must name the top of the copy itself, not something in it", h.Name)
	}
	if name == "" {
		name = top
	}
	x.top, x.name = top, name
	switch h.Typeflag {
	case tar.TypeDir:
		err = x.tree(h)
	case tar.TypeReg, tar.TypeRegA, tar.TypeSymlink:
		if sparse(h) {
			err = fmt.Errorf("entry %q: the top is a sparse file, which is not supported; copy it as a plain file", h.Name)
			break
		}
		err = x.single(h)
	default:
		err = fmt.Errorf("entry %q: the top is a %s; it must be a directory, regular file or symlink", h.Name, typeName(h.Typeflag))
	}
	if err != nil {
		return st, fmt.Errorf("extract to %q: %w", name, err)
	}
	st.Name = name
	return st, nil
}

// dirRec is a directory the extraction made or went through.
type dirRec struct {
	parent  int32 // its parent's index; -1 for the target
	depth   int32 // how many directories below the target it is
	name    string
	keep    bool // there before: its mode and times stay
	hasTime bool
	mode    uint32
	mtime   unix.Timespec
}

// dirKey finds a dirRec by parent and name.
type dirKey struct {
	parent int32
	name   string
}

// level is one directory on the way to the one last resolved.
type level struct {
	name     string
	idx      int32
	fd       int    // O_PATH descriptor, or -1 once closed to bound them
	dev, ino uint64 // its identity, to check it when it is opened again
}

type extractor struct {
	ctx    context.Context
	opts   Options
	st     *Stats
	tr     *tar.Reader
	er     *endReader // what tr reads from
	top    string     // the archive's top name
	parent int        // the directory the target is in
	name   string     // the target's name in parent

	root   int     // O_PATH descriptor of the target, or of its temporary stand-in
	topRec *dirRec // a new top directory's mode and time; nil when merging
	dirs   []dirRec
	index  map[dirKey]int32
	path   []level // the directory last resolved, below root
	open   int     // descriptors open in path
	buf    []byte

	// Where the data of the last entry read ends: hdrEnd bytes into the
	// stream, then dataLen bytes (-1: not known, a sparse file's).
	hdrEnd, dataLen int64
}

// endReader counts the bytes read through it and the zeros ending
// them, so that tar's end marker can be told from a stream cut between
// two entries, which archive/tar takes for the end as well.
type endReader struct {
	r     io.Reader
	n     int64 // bytes read
	zeros int64 // how many of them, at the end, are zeros
}

func (e *endReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	i := n - 1
	for i >= 0 && p[i] == 0 {
		i--
	}
	if i < 0 {
		e.zeros += int64(n)
	} else {
		e.zeros = int64(n - 1 - i)
	}
	e.n += int64(n)
	return n, err
}

// next returns the next header that describes an entry, skipping PAX
// global headers, or io.EOF at tar's end marker.
func (x *extractor) next() (*tar.Header, error) {
	for {
		h, err := x.tr.Next()
		if errors.Is(err, tar.ErrInsecurePath) && h != nil {
			err = nil // cleanName judges names
		}
		if err == io.EOF {
			// The marker is two blocks of zeros right after the last
			// entry's data; archive/tar also stops where the stream
			// does, after one block or none.
			if x.er.zeros < 1024 || (x.dataLen >= 0 && x.er.n-x.hdrEnd-x.dataLen != 1024) {
				return nil, errors.New("the archive ends without tar's end marker: it was cut short; copy again")
			}
			return nil, io.EOF
		}
		if err != nil {
			return nil, fmt.Errorf("read the archive: %w", err)
		}
		x.hdrEnd = x.er.n
		switch h.Typeflag {
		case tar.TypeXGlobalHeader:
			x.dataLen = 0
			continue
		case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
			x.dataLen = 0 // archive/tar reads no data for these
		default:
			x.dataLen = (h.Size + 511) &^ 511
			if sparse(h) {
				x.dataLen = -1
			}
		}
		return h, nil
	}
}

// cleanName turns an entry name into a clean relative path, or refuses
// it.
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", errors.New("the name holds a NUL byte")
	}
	if strings.HasPrefix(name, "/") {
		return "", errors.New("the name is absolute; an archive may only name entries inside its top")
	}
	for c := range strings.SplitSeq(name, "/") {
		if c == ".." {
			return "", errors.New(`the name has a ".." component; an archive may only name entries inside its top`)
		}
	}
	c := path.Clean(strings.TrimRight(name, "/"))
	if c == "." {
		return "", errors.New("the name names no file")
	}
	return c, nil
}

// sparse says whether h is a GNU sparse file.
func sparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// single places a top file or symlink, once the stream has ended.
func (x *extractor) single(h *tar.Header) error {
	var old unix.Stat_t
	err := unix.Fstatat(x.parent, x.name, &old, unix.AT_SYMLINK_NOFOLLOW)
	exists := err == nil
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if exists && old.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("it is a directory and the archive holds a %s; remove it or copy to another name", typeName(h.Typeflag))
	}
	tmp, err := x.make(x.parent, h)
	if err != nil {
		return fmt.Errorf("entry %q: %w", h.Name, err)
	}
	if h2, err := x.next(); err != io.EOF {
		unix.Unlinkat(x.parent, tmp, 0)
		if err != nil {
			return err
		}
		return fmt.Errorf("entry %q: the top %q is not a directory, so the archive may hold nothing else", h2.Name, x.top)
	}
	if err := x.ctx.Err(); err != nil {
		unix.Unlinkat(x.parent, tmp, 0)
		return err
	}
	if exists {
		err = unix.Renameat(x.parent, tmp, x.parent, x.name)
	} else {
		err = renameNoReplace(x.parent, tmp, x.name)
	}
	if err != nil {
		unix.Unlinkat(x.parent, tmp, 0)
		switch {
		case errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOTEMPTY):
			return errors.New("it appeared while the archive was read; copy again")
		case errors.Is(err, unix.EISDIR):
			return errors.New("it became a directory while the archive was read; remove it or copy to another name")
		}
		return err
	}
	x.count(h)
	return nil
}

// tree extracts a directory top: into a fresh temporary directory that
// is renamed into place at the end, or merged into an existing directory.
func (x *extractor) tree(h *tar.Header) error {
	var old unix.Stat_t
	err := unix.Fstatat(x.parent, x.name, &old, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && old.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("it is a %s and the archive holds a directory; remove it or copy to another name", kindOf(old.Mode))
	}
	if err == nil {
		x.root, err = openTarget(x.parent, x.name)
		if err != nil {
			return err
		}
		err = x.run()
		if aerr := x.applyDirs(); err == nil {
			err = aerr
		}
		return err
	}
	if !errors.Is(err, unix.ENOENT) {
		return err
	}
	tmp := ""
	for range 16 {
		tmp = tempName()
		if err = unix.Mkdirat(x.parent, tmp, 0o700); !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("make a temporary directory: %w", err)
	}
	x.st.Dirs++
	topRec := x.dirRec(h, -1, tmp)
	x.topRec = &topRec
	if x.root, err = openTarget(x.parent, tmp); err == nil {
		if err = x.run(); err == nil {
			err = x.ctx.Err()
		}
	}
	if err == nil {
		err = x.applyDirs()
	}
	if err == nil {
		err = setDir(x.parent, &topRec)
	}
	x.closePath()
	if err == nil {
		err = renameNoReplace(x.parent, tmp, x.name)
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			err = errors.New("it appeared while the archive was read; copy again")
		}
	}
	if err != nil {
		if rerr := removeAll(x.parent, tmp); rerr != nil {
			return fmt.Errorf("%w (and removing the temporary %q failed: %v)", err, tmp, rerr)
		}
		return err
	}
	return nil
}

// run extracts the entries after the top, until the stream ends.
func (x *extractor) run() error {
	x.index = map[dirKey]int32{}
	x.buf = make([]byte, 256<<10)
	for {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		h, err := x.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := x.entry(h); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
}

// entry extracts one entry below a directory top.
func (x *extractor) entry(h *tar.Header) error {
	c, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	rel, ok := strings.CutPrefix(c, x.top)
	if !ok || (rel != "" && rel[0] != '/') {
		return fmt.Errorf("it is not under the top %q; an archive holds one file or directory", x.top)
	}
	rel = strings.TrimPrefix(rel, "/")
	isFile := h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeRegA || h.Typeflag == tar.TypeSymlink
	if isFile && sparse(h) {
		x.st.Skipped++
		return nil
	}
	if rel == "" {
		switch {
		case h.Typeflag == tar.TypeDir:
			if x.topRec != nil { // the top again: a later entry wins, as in tar
				*x.topRec = x.dirRec(h, -1, x.topRec.name)
			}
			return nil
		case isFile:
			return errors.New("it would replace the top directory with a file")
		}
		x.st.Skipped++
		return nil
	}
	if !isFile && h.Typeflag != tar.TypeDir {
		x.st.Skipped++
		return nil
	}
	comps := strings.Split(rel, "/")
	base := comps[len(comps)-1]
	pfd, pidx, err := x.resolve(comps[:len(comps)-1], true)
	if err != nil {
		return err
	}
	if h.Typeflag == tar.TypeDir {
		return x.dir(pfd, pidx, base, h)
	}
	if _, ok := x.index[dirKey{pidx, base}]; ok {
		return fmt.Errorf("%q is a directory; an archive may not replace a directory with a %s", rel, typeName(h.Typeflag))
	}
	tmp, err := x.make(pfd, h)
	if err != nil {
		return err
	}
	if err := unix.Renameat(pfd, tmp, pfd, base); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%q is a directory; an archive may not replace a directory with a %s", rel, typeName(h.Typeflag))
		}
		return err
	}
	x.count(h)
	return nil
}

// count adds the file or symlink h to the stats.
func (x *extractor) count(h *tar.Header) {
	if h.Typeflag == tar.TypeSymlink {
		x.st.Symlinks++
		return
	}
	x.st.Files++
	x.st.Bytes += h.Size
}

// dir makes the directory entry h, named base in pfd (whose record is
// pidx), or takes in one already there.
func (x *extractor) dir(pfd int, pidx int32, base string, h *tar.Header) error {
	if i, ok := x.index[dirKey{pidx, base}]; ok {
		if d := &x.dirs[i]; !d.keep {
			depth := d.depth
			*d = x.dirRec(h, pidx, base) // a later entry wins, as in tar
			d.depth = depth
		}
		return nil
	}
	err := unix.Mkdirat(pfd, base, 0o700)
	if err == nil {
		x.st.Dirs++
		return x.add(x.dirRec(h, pidx, base))
	}
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%q is a %s, not a directory; an archive may not replace it with a directory", base, kindOf(st.Mode))
	}
	return x.add(dirRec{parent: pidx, name: base, keep: true})
}

// dirRec returns the record of the directory entry h, named name in the
// directory whose record is parent.
func (x *extractor) dirRec(h *tar.Header, parent int32, name string) dirRec {
	d := dirRec{parent: parent, name: name, mode: x.mode(h.Mode)}
	if ts, err := unix.TimeToTimespec(h.ModTime); err == nil {
		d.mtime, d.hasTime = ts, true
	}
	return d
}

// add records the directory d.
func (x *extractor) add(d dirRec) error {
	if len(x.dirs) >= maxDirs {
		return fmt.Errorf("the archive holds more than %d directories; copy it in parts", maxDirs)
	}
	d.depth = 1
	if d.parent >= 0 {
		d.depth = x.dirs[d.parent].depth + 1
	}
	x.dirs = append(x.dirs, d)
	x.index[dirKey{d.parent, d.name}] = int32(len(x.dirs) - 1)
	return nil
}

// mode returns the mode to give an entry whose archive mode is m.
func (x *extractor) mode(m int64) uint32 {
	mode := uint32(m) & 0o777
	if x.opts.KeepSpecial {
		mode |= uint32(m) & (unix.S_ISUID | unix.S_ISGID | unix.S_ISVTX)
	}
	return mode &^ x.opts.Umask
}

// make writes the file or symlink h under a temporary name in pfd, with
// its content, mode and times, and returns the name.
func (x *extractor) make(pfd int, h *tar.Header) (string, error) {
	ts, err := unix.TimeToTimespec(h.ModTime)
	if err != nil {
		return "", fmt.Errorf("modification time %v: %w", h.ModTime, err)
	}
	times := []unix.Timespec{ts, ts}
	if h.Typeflag == tar.TypeSymlink {
		if h.Linkname == "" || strings.IndexByte(h.Linkname, 0) >= 0 {
			return "", fmt.Errorf("symlink target %q: no symlink can hold it", h.Linkname)
		}
		tmp := ""
		for range 16 {
			tmp = tempName()
			if err = unix.Symlinkat(h.Linkname, pfd, tmp); !errors.Is(err, unix.EEXIST) {
				break
			}
		}
		if err != nil {
			return "", fmt.Errorf("make the symlink: %w", err)
		}
		if err := unix.UtimesNanoAt(pfd, tmp, times, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			unix.Unlinkat(pfd, tmp, 0)
			return "", fmt.Errorf("set times: %w", err)
		}
		return tmp, nil
	}
	tmp, fd := "", -1
	for range 16 {
		tmp = tempName()
		fd, err = unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("make the file: %w", err)
	}
	err = x.content(fd, h.Size)
	if err == nil {
		if err = unix.Fchmod(fd, x.mode(h.Mode)); err != nil {
			err = fmt.Errorf("set the mode: %w", err)
		}
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = fmt.Errorf("write: %w", cerr)
	}
	if err == nil {
		if err = unix.UtimesNanoAt(pfd, tmp, times, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			err = fmt.Errorf("set times: %w", err)
		}
	}
	if err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return "", err
	}
	return tmp, nil
}

// zeros is a block of zeros, to find the runs left holes.
var zeros [holeBlock]byte

// content copies the current entry's size bytes to fd, leaving aligned
// blocks of zeros holes, and gives fd that size.
func (x *extractor) content(fd int, size int64) error {
	if x.buf == nil {
		x.buf = make([]byte, 256<<10)
	}
	for off := int64(0); off < size; {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		b := x.buf[:min(int64(len(x.buf)), size-off)]
		if _, err := io.ReadFull(x.tr, b); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("read the archive: %w", err)
		}
		// off is a multiple of holeBlock: every chunk but the last fills buf.
		start := -1 // where the data not yet written starts in b
		for i := 0; i < len(b); i += holeBlock {
			blk := b[i:min(i+holeBlock, len(b))]
			if bytes.Equal(blk, zeros[:len(blk)]) {
				if start >= 0 {
					if err := pwriteAll(fd, b[start:i], off+int64(start)); err != nil {
						return err
					}
					start = -1
				}
			} else if start < 0 {
				start = i
			}
		}
		if start >= 0 {
			if err := pwriteAll(fd, b[start:], off+int64(start)); err != nil {
				return err
			}
		}
		off += int64(len(b))
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// pwriteAll writes all of b to fd at off.
func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// resolve returns a descriptor of the directory comps below the target
// and its record, making the directories missing (0700, given 0755 at
// the end) when create says so. It goes through no symlink and no mount
// point. The descriptor belongs to the extractor: valid until the next
// resolve.
func (x *extractor) resolve(comps []string, create bool) (int, int32, error) {
	n := 0
	for n < len(comps) && n < len(x.path) && x.path[n].name == comps[n] {
		n++
	}
	x.up(n)
	for len(x.path) < len(comps) {
		pfd, pidx, err := x.fdOf(len(x.path))
		if err != nil {
			return -1, 0, err
		}
		c := comps[len(x.path)]
		idx, known := x.index[dirKey{pidx, c}]
		fd, err := openBeneath(pfd, c)
		if errors.Is(err, unix.ENOENT) && create && !known {
			if err = unix.Mkdirat(pfd, c, 0o700); err == nil {
				x.st.Dirs++
				d := dirRec{parent: pidx, name: c, mode: 0o755 &^ x.opts.Umask}
				if err := x.add(d); err != nil {
					return -1, 0, err
				}
				idx, known = int32(len(x.dirs)-1), true
				fd, err = openBeneath(pfd, c)
			}
		}
		if err != nil {
			return -1, 0, whyNotDir(pfd, c, strings.Join(comps[:len(x.path)+1], "/"), err)
		}
		if !known {
			if err := x.add(dirRec{parent: pidx, name: c, keep: true}); err != nil {
				unix.Close(fd)
				return -1, 0, err
			}
			idx = int32(len(x.dirs) - 1)
		}
		dev, ino, err := identity(fd)
		if err != nil {
			unix.Close(fd)
			return -1, 0, err
		}
		x.path = append(x.path, level{name: c, idx: idx, fd: fd, dev: dev, ino: ino})
		x.open++
		x.bound()
	}
	return x.fdOf(len(x.path))
}

// up keeps the first n levels of path and closes the others. Where the
// new last level's descriptor was closed, it climbs to it with "..",
// checking each directory it comes to: a step per level, where opening it
// again from the target would take one per level above it. Where the
// climb fails, fdOf opens the level again from above.
func (x *extractor) up(n int) {
	for len(x.path) > n {
		last := len(x.path) - 1
		l := x.path[last]
		if last > 0 && l.fd >= 0 && x.path[last-1].fd < 0 {
			p := &x.path[last-1]
			fd, err := unix.Openat(l.fd, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err == nil && !sameFile(fd, p.dev, p.ino) {
				unix.Close(fd)
				err = fmt.Errorf("%q was moved while the archive was extracted", p.name)
			}
			if err == nil {
				p.fd = fd
				x.open++
			}
		}
		if l.fd >= 0 {
			unix.Close(l.fd)
			x.open--
		}
		x.path = x.path[:last]
	}
}

// fdOf returns a descriptor of the directory depth levels below the
// target (x.path[:depth]) and its record, opening it again from the
// nearest open level above if it was closed.
func (x *extractor) fdOf(depth int) (int, int32, error) {
	if depth == 0 {
		return x.root, -1, nil
	}
	if l := x.path[depth-1]; l.fd >= 0 {
		return l.fd, l.idx, nil
	}
	j := depth - 2
	for j >= 0 && x.path[j].fd < 0 {
		j--
	}
	for k := j + 1; k < depth; k++ {
		pfd := x.root
		if k > 0 {
			pfd = x.path[k-1].fd
		}
		fd, err := openBeneath(pfd, x.path[k].name)
		if err != nil {
			var rel []string
			for _, l := range x.path[:k+1] {
				rel = append(rel, l.name)
			}
			return -1, 0, whyNotDir(pfd, x.path[k].name, strings.Join(rel, "/"), err)
		}
		if dev, ino, err := identity(fd); err != nil || dev != x.path[k].dev || ino != x.path[k].ino {
			unix.Close(fd)
			return -1, 0, fmt.Errorf("%q was moved while the archive was extracted", x.path[k].name)
		}
		x.path[k].fd = fd
		x.open++
		x.bound()
	}
	l := x.path[depth-1]
	return l.fd, l.idx, nil
}

// bound closes the shallowest descriptors in path beyond maxOpen.
func (x *extractor) bound() {
	for i := 0; x.open > maxOpen && i < len(x.path); i++ {
		if x.path[i].fd >= 0 {
			unix.Close(x.path[i].fd)
			x.path[i].fd = -1
			x.open--
		}
	}
}

// closePath closes every descriptor the extractor holds.
func (x *extractor) closePath() {
	for _, l := range x.path {
		if l.fd >= 0 {
			unix.Close(l.fd)
		}
	}
	x.path, x.open = nil, 0
	if x.root >= 0 {
		unix.Close(x.root)
		x.root = -1
	}
}

// applyDirs gives the directories made their modes and times, deepest
// first: each after all it holds, so a read-only one could be filled and
// its time is not changed by what goes in it after. It tries them all and
// returns the first error.
func (x *extractor) applyDirs() error {
	var first error
	var comps []string
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if d.keep {
			continue
		}
		// Records come after their parents, so the one before is most
		// often the parent or a sibling: the parent is then on the path
		// already, and found without going through the names.
		pd := int(d.depth - 1)
		var pfd int
		var err error
		if pd == 0 || (pd <= len(x.path) && x.path[pd-1].idx == d.parent) {
			x.up(pd)
			pfd, _, err = x.fdOf(pd)
		} else {
			comps = comps[:0]
			for p := d.parent; p >= 0; p = x.dirs[p].parent {
				comps = append(comps, x.dirs[p].name)
			}
			slices.Reverse(comps)
			pfd, _, err = x.resolve(comps, false)
		}
		if err == nil {
			err = setDir(pfd, &d)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("set the mode of directory %q: %w", d.name, err)
		}
	}
	return first
}

// setDir gives the directory d.name in pfd the mode and time d holds.
func setDir(pfd int, d *dirRec) error {
	fd, err := openDir(pfd, d.name)
	if err != nil {
		return err
	}
	err = unix.Fchmod(fd, d.mode)
	unix.Close(fd)
	if err != nil {
		return err
	}
	if d.hasTime {
		return unix.UtimesNanoAt(pfd, d.name, []unix.Timespec{d.mtime, d.mtime}, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// openTarget returns an O_PATH descriptor of the directory name in
// dirfd, the target, which may be a mount point but not a symlink.
func openTarget(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return -1, errors.New("it stopped being a directory while the archive was read; copy again")
	}
	return fd, err
}

// noOpenat2 is set once openat2 is found missing (Linux before 5.6).
var noOpenat2 atomic.Bool

// openBeneath returns an O_PATH descriptor of the directory name in
// dirfd, refusing a symlink, a magic link and a mount point.
func openBeneath(dirfd int, name string) (int, error) {
	if !noOpenat2.Load() {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if !errors.Is(err, unix.ENOSYS) {
			return fd, err
		}
		noOpenat2.Store(true)
	}
	// One component, never "..", O_NOFOLLOW: no symlink is followed.
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	pdev, _, err1 := identity(dirfd)
	dev, _, err2 := identity(fd)
	if err1 != nil || err2 != nil || pdev != dev {
		unix.Close(fd)
		return -1, unix.EXDEV
	}
	return fd, nil
}

// whyNotDir turns the error of opening the directory name in dirfd
// (rel below the target) into one that says why.
func whyNotDir(dirfd int, name, rel string, err error) error {
	var st unix.Stat_t
	switch {
	case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return fmt.Errorf("%q is a symlink; an archive may not write through one", rel)
			}
			return fmt.Errorf("%q is a %s, not a directory; an archive may not write through it", rel, kindOf(st.Mode))
		}
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%q is a mount point; an archive may not write across one", rel)
	}
	return fmt.Errorf("open directory %q: %w", rel, err)
}

// renameNoReplace renames old to name in dirfd unless name exists.
func renameNoReplace(dirfd int, old, name string) error {
	err := unix.Renameat2(dirfd, old, dirfd, name, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// The file system cannot tell: check, then rename.
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); !errors.Is(err, unix.ENOENT) {
			if err == nil {
				return unix.EEXIST
			}
			return err
		}
		return unix.Renameat(dirfd, old, dirfd, name)
	}
	return err
}

// typeName names a tar entry type in errors.
func typeName(t byte) string {
	switch t {
	case tar.TypeReg, tar.TypeRegA:
		return "regular file"
	case tar.TypeDir:
		return "directory"
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "fifo"
	case tar.TypeGNUSparse:
		return "sparse file"
	}
	return fmt.Sprintf("entry of type %q", t)
}
