package cowfs

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// importNode is one path of a host tree being imported.
type importNode struct {
	e        Entry
	devino   [2]uint64
	children []*importNode
}

// Import stores the host directory dir as a snapshot and returns its id.
// Symlinks are stored, not followed; hard links inside dir stay hard links;
// user.* extended attributes are kept. If name is not empty the snapshot
// also gets that name.
func (f *FS) Import(ctx context.Context, dir, name string) (SnapshotID, error) {
	if name != "" {
		if err := checkName("snapshot", name); err != nil {
			return SnapshotID{}, err
		}
	}
	if id, ok := f.importUnchanged(dir); ok {
		if name != "" {
			return id, f.NameSnapshot(ctx, id, name)
		}
		return id, nil
	}
	im := &importer{f: f, ctx: ctx, links: map[[2]uint64]*linkGroup{}, slots: make(chan struct{}, importWalkers)}
	im.reuse = f.loadImportReuse(dir, time.Now())
	im.watch = f.watch.begin(dir)
	id, err := im.run(dir, name)
	f.watch.end(im.watch, id, err)
	return id, err
}

// importUnchanged returns the snapshot of dir's last import when the
// import watch saw no change under dir since, and that snapshot is still
// kept.
func (f *FS) importUnchanged(dir string) (SnapshotID, bool) {
	id, ok := f.watch.unchanged(dir)
	if !ok {
		return id, false
	}
	if _, kept, err := f.getRef(refSnap + id.String()); err != nil || !kept {
		return id, false
	}
	return id, true
}

// run walks and stores dir.
func (im *importer) run(dir, name string) (SnapshotID, error) {
	f, ctx := im.f, im.ctx
	top, err := im.walk(unix.AT_FDCWD, dir, dir)
	if err != nil {
		return SnapshotID{}, err
	}
	if top.e.Type != TypeDir {
		return SnapshotID{}, fmt.Errorf("import %s: not a directory", dir)
	}
	for _, g := range im.links {
		if g.names > 1 {
			g.id = randomLinkID()
		}
	}
	if err := im.store(top); err != nil {
		return SnapshotID{}, err
	}
	id, err := putRoot(f.store, top.e)
	if err != nil {
		return SnapshotID{}, fmt.Errorf("import %s: write root: %w", dir, err)
	}
	if err := f.keepSnapshot(id); err != nil {
		return id, fmt.Errorf("import %s: %w", dir, err)
	}
	if name != "" {
		if err := f.NameSnapshot(ctx, id, name); err != nil {
			return id, err
		}
	}
	im.reuse.save()
	return id, nil
}

type linkGroup struct {
	names   int
	id      uint64
	content chunkstore.ID
	size    int64
	xattrs  []Xattr
}

type importer struct {
	f     *FS
	ctx   context.Context
	reuse *importReuse  // the previous import of the same directory
	watch *watchTree    // this import's tree in the import watch
	slots chan struct{} // walks running on goroutines of their own
	mu    sync.Mutex    // guards links and calls of importHook
	links map[[2]uint64]*linkGroup
}

// importWalkers bounds the goroutines one Import walks the tree with.
var importWalkers = 2 * runtime.GOMAXPROCS(0)

func randomLinkID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	v := binary.LittleEndian.Uint64(b[:])
	if v == 0 {
		v = 1
	}
	return v
}

// importHook, when set (by tests), runs between an entry's first look
// and the opening of its contents: the moment a racing writer would swap
// the entry.
var importHook func(path string)

// walk reads the entry name of the directory open as dirfd (AT_FDCWD and
// a path for the top). It never follows a symlink: every entry is looked
// at with fstatat(AT_SYMLINK_NOFOLLOW) and opened with O_NOFOLLOW relative
// to its parent's descriptor, and its contents are read through a
// descriptor checked to be the inode looked at, so an entry swapped for a
// symlink meanwhile fails the import instead of reading what the symlink
// points at. path only names the entry in errors.
func (im *importer) walk(dirfd int, name, path string) (*importNode, error) {
	if err := im.ctx.Err(); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, fmt.Errorf("import: stat %s: %w", path, err)
	}
	if dirfd != unix.AT_FDCWD {
		if n := im.reused(name, path, &st); n != nil {
			return n, nil // unchanged since the last import: not opened
		}
	}
	n := &importNode{devino: [2]uint64{st.Dev, st.Ino}}
	n.e = Entry{
		Name:    name,
		Mode:    st.Mode & 07777,
		UID:     st.Uid,
		GID:     st.Gid,
		MtimeNs: st.Mtim.Nano(),
		Nlink:   1,
	}
	if dirfd == unix.AT_FDCWD {
		n.e.Name = "" // the top: its name is the caller's path
	}
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		im.f.watch.notWatchable(im.watch) // it can change through a name elsewhere
		im.mu.Lock()
		g := im.links[n.devino]
		if g != nil {
			g.names++
		} else {
			im.links[n.devino] = &linkGroup{names: 1}
		}
		im.mu.Unlock()
		if g != nil && typ == unix.S_IFREG {
			n.e.Type = TypeFile
			return n, nil // content read once, with the first name
		}
	}
	if importHook != nil {
		im.mu.Lock()
		importHook(path)
		im.mu.Unlock()
	}
	switch typ {
	case unix.S_IFDIR:
		n.e.Type = TypeDir
		d, err := openSame(dirfd, name, path, unix.O_DIRECTORY, &st)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		im.f.watch.add(im.watch, int(d.Fd()), &st, dirfd == unix.AT_FDCWD)
		if n.e.Xattrs, err = readXattrs(d); err != nil {
			return nil, err
		}
		names, err := d.Readdirnames(-1)
		if err != nil {
			return nil, fmt.Errorf("import: read dir %s: %w", path, err)
		}
		if n.children, err = im.walkChildren(int(d.Fd()), path, names); err != nil {
			return nil, err
		}
	case unix.S_IFREG:
		n.e.Type = TypeFile
		fh, err := openSame(dirfd, name, path, unix.O_NONBLOCK, &st)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		if n.e.Xattrs, err = readXattrs(fh); err != nil {
			return nil, err
		}
		refs, err := im.content(fh, &st)
		if err != nil {
			return nil, fmt.Errorf("import: store %s: %w", path, err)
		}
		var total int64
		for _, r := range refs {
			total += r.Size
		}
		n.e.Size = total
		if n.e.ID, err = putFile(im.f.store, refs); err != nil {
			return nil, fmt.Errorf("import: store file object of %s: %w", path, err)
		}
		im.mu.Lock()
		g := im.links[n.devino]
		im.mu.Unlock()
		if g != nil {
			g.content, g.size, g.xattrs = n.e.ID, n.e.Size, n.e.Xattrs
		} else {
			im.reuse.note(path, &st, &n.e, true)
		}
	case unix.S_IFLNK:
		n.e.Type = TypeSymlink
		pfd, err := openSameFd(dirfd, name, path, unix.O_PATH, &st)
		if err != nil {
			return nil, err
		}
		defer unix.Close(pfd)
		buf := make([]byte, unix.PathMax)
		k, err := unix.Readlinkat(pfd, "", buf)
		if err != nil {
			return nil, fmt.Errorf("import: readlink %s: %w", path, err)
		}
		n.e.Target = string(buf[:k])
		n.e.Size = int64(k)
	case unix.S_IFIFO:
		n.e.Type = TypeFifo
	case unix.S_IFSOCK:
		n.e.Type = TypeSocket
	case unix.S_IFCHR:
		n.e.Type, n.e.Rdev = TypeChar, st.Rdev
	case unix.S_IFBLK:
		n.e.Type, n.e.Rdev = TypeBlock, st.Rdev
	default:
		return nil, fmt.Errorf("import: %s: unknown file type %#o", path, typ)
	}
	return n, nil
}

// walkChildren walks the entries names of the directory open as dirfd
// (at path), in order. Entries are walked on other goroutines while one of
// the importer's slots is free, on this one otherwise: a walk costs
// syscalls, which run in parallel on several CPUs.
func (im *importer) walkChildren(dirfd int, path string, names []string) ([]*importNode, error) {
	out := make([]*importNode, len(names))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i, cn := range names {
		select {
		case im.slots <- struct{}{}:
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := im.walk(dirfd, cn, filepath.Join(path, cn))
				<-im.slots
				mu.Lock()
				out[i] = c
				if err != nil && first == nil {
					first = err
				}
				mu.Unlock()
			}()
		default:
			c, err := im.walk(dirfd, cn, filepath.Join(path, cn))
			mu.Lock()
			out[i] = c
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		}
		mu.Lock()
		err := first
		mu.Unlock()
		if err != nil {
			break
		}
	}
	wg.Wait() // the caller closes dirfd after this
	return out, first
}

// openSame opens entry name of dirfd for reading, without following a
// symlink, and checks that it is still the inode described by want.
func openSame(dirfd int, name, path string, flags int, want *unix.Stat_t) (*os.File, error) {
	fd, err := openSameFd(dirfd, name, path, unix.O_RDONLY|flags, want)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openSameFd is openSame returning the descriptor (flags may hold O_PATH).
func openSameFd(dirfd int, name, path string, flags int, want *unix.Stat_t) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_NOFOLLOW|unix.O_CLOEXEC|flags, 0)
	if err != nil {
		return -1, fmt.Errorf("import: open %s: %w (changed while importing?)", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("import: stat %s: %w", path, err)
	}
	if st.Dev != want.Dev || st.Ino != want.Ino {
		unix.Close(fd)
		return -1, fmt.Errorf("import: %s changed while importing; import again", path)
	}
	return fd, nil
}

// store writes directory objects bottom-up and fills in hard-link fields.
func (im *importer) store(n *importNode) error {
	if n.e.Type != TypeDir {
		g := im.links[n.devino]
		if g != nil && g.names > 1 {
			n.e.LinkID = g.id
			n.e.Nlink = uint32(g.names)
		}
		if g != nil && n.e.Type == TypeFile {
			n.e.ID, n.e.Size, n.e.Xattrs = g.content, g.size, g.xattrs
		}
		return nil
	}
	entries := make([]Entry, 0, len(n.children))
	for _, c := range n.children {
		if err := im.store(c); err != nil {
			return err
		}
		entries = append(entries, c.e)
	}
	id, err := putDir(im.f.store, entries)
	if err != nil {
		return fmt.Errorf("import: store directory %q: %w", n.e.Name, err)
	}
	n.e.ID = id
	n.e.Size = 0
	return nil
}

// readXattrs returns the user.* extended attributes of the open file fh
// (only regular files and directories can carry them).
func readXattrs(fh *os.File) ([]Xattr, error) {
	fd := int(fh.Fd())
	sz, err := unix.Flistxattr(fd, nil)
	if err != nil || sz == 0 {
		return nil, nil // no xattr support or none set
	}
	buf := make([]byte, sz)
	sz, err = unix.Flistxattr(fd, buf)
	if err != nil {
		return nil, nil
	}
	var xs []Xattr
	for _, name := range strings.Split(string(buf[:sz]), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		vs, err := unix.Fgetxattr(fd, name, nil)
		if err != nil {
			continue
		}
		v := make([]byte, vs)
		vs, err = unix.Fgetxattr(fd, name, v)
		if err != nil {
			continue
		}
		xs = append(xs, Xattr{Name: name, Value: v[:vs]})
	}
	return xs, nil
}

// content stores the bytes of regular file fh (st its stat) and returns
// its pieces. A sparse file (fewer blocks than its size needs) is read
// region by region with SEEK_DATA and SEEK_HOLE, its holes becoming hole
// pieces unread: a file of a terabyte of holes costs what its data does,
// not a terabyte of reading.
func (im *importer) content(fh *os.File, st *unix.Stat_t) ([]fileRef, error) {
	if st.Blocks*512 >= st.Size {
		refs, err := im.f.store.PutStream(im.ctx, fh)
		return fileRefs(refs), err
	}
	fd := int(fh.Fd())
	var out []fileRef
	for pos := int64(0); pos < st.Size; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = st.Size // only a hole is left
		} else if err != nil {
			return nil, fmt.Errorf("seek data: %w", err)
		}
		data = min(data, st.Size)
		out = appendHole(out, data-pos)
		if data >= st.Size {
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole: %w", err)
		}
		hole = min(hole, st.Size)
		refs, err := im.f.store.PutStream(im.ctx, io.NewSectionReader(fh, data, hole-data))
		if err != nil {
			return nil, err
		}
		var got int64
		for _, r := range fileRefs(refs) {
			if r.ID.IsZero() {
				out = appendHole(out, r.Size)
			} else {
				out = append(out, r)
			}
			got += r.Size
		}
		if got < hole-data {
			break // the file shrank while it was read: it ends here
		}
		pos = hole
	}
	return out, nil
}
