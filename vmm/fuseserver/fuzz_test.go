package fuseserver

import (
	"bytes"
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"tine/internal/fuzzbytes"
)

// fuzzMaxOps bounds the operations decoded from one input.
const fuzzMaxOps = 64

// Operation codes of FuzzServer's input: each operation is one byte, whose low
// five bits are the code and whose next two bits pick the caller, followed by
// the arguments that its case in fuzzEnv.step reads.
const (
	opLookup = iota
	opGetAttr
	opSetAttr
	opMkdir
	opMknod
	opCreate
	opOpen
	opRead
	opWrite
	opRelease
	opUnlink
	opRmdir
	opRename
	opLink
	opSymlink
	opReadlink
	opOpenDir
	opReadDir
	opReadDirPlus
	opReleaseDir
	opSetXAttr
	opGetXAttr
	opListXAttr
	opRemoveXAttr
	opStatFs
	opForget
	opAccess
	opFsync
	opLseek
	opFallocate
	opCopyFileRange
	opMove // export the tables and import them into a new server
)

// Names used for the tree, and names that are not one path component. A name
// byte below 0xe0 picks from fuzzNames, above from hostileNames.
var (
	fuzzNames    = []string{"a", "b", "c", "f", "esc", "abs", "up", "p", "secret", "outside", "root"}
	hostileNames = []string{"", ".", "..", "a/b", "../outside", "/", "x\x00y",
		strings.Repeat("n", 255), strings.Repeat("n", 256), "secret\x00"}
	fuzzTargets = []string{"/", "..", "../..", "../outside", "../outside/secret", "a", "a/f", "p",
		"/etc/passwd", "", "x\x00y", strings.Repeat("t/", unix.PathMax/2)}
	fuzzXNames = []string{"user.a", "user.b", "trusted.t", "security.capability",
		"system.posix_acl_access", "user.", "", "x", "user." + strings.Repeat("x", 255), "user.\x00"}
)

// fuzzEnv is one input's tree and server: the served root lies in base, next
// to base/outside, which nothing may change.
type fuzzEnv struct {
	*fuzzbytes.Reader // the input

	t       testing.TB
	base    string
	root    string
	secret  string
	s       *Server
	fdStart int // open fds before the server existed
	watch   int // inotify watch of IN_OPEN in the root, on fuzzNotify
	reader  int // read end of the FIFO root/p, so that an open for writing succeeds

	ids, fhs   []uint64 // node ids and handles answered, in order
	seenNodes  map[uint64]bool
	goneNodes  map[uint64]bool // answered once, then dropped from the table
	seenFhs    map[uint64]bool
	goneFhs    map[uint64]bool
	codes      []fuse.Status // each operation's answer
	secretStat unix.Stat_t
	outStat    unix.Stat_t
	baseStat   unix.Stat_t
}

// node picks an answered node id, or an arbitrary one for a byte of 0xf0 up.
func (e *fuzzEnv) node() uint64 {
	b := e.Byte()
	if b < 0xf0 {
		return e.ids[int(b)%len(e.ids)]
	}
	e.s.mu.Lock()
	next := e.s.nextNode
	e.s.mu.Unlock()
	return [...]uint64{0, rootID, 2, next, next - 1, 1 << 32, 1 << 63, ^uint64(0)}[b&7]
}

// fh picks an answered handle (file or directory), or an arbitrary one.
func (e *fuzzEnv) fh() uint64 {
	b := e.Byte()
	if b < 0xf0 && len(e.fhs) > 0 {
		return e.fhs[int(b)%len(e.fhs)]
	}
	e.s.mu.Lock()
	next := e.s.nextHandle
	e.s.mu.Unlock()
	return [...]uint64{0, 1, 2, next, next - 1, 1 << 32, 1 << 63, ^uint64(0)}[b&7]
}

func (e *fuzzEnv) name() string {
	b := e.Byte()
	if b < 0xe0 {
		return fuzzNames[int(b)%len(fuzzNames)]
	}
	return hostileNames[int(b)%len(hostileNames)]
}

// off is an offset or size: the byte itself, or a large value from 0xf8 up.
func (e *fuzzEnv) off() uint64 {
	b := e.Byte()
	if b < 0xf8 {
		return uint64(b)
	}
	return [...]uint64{4096, 1 << 20, 1 << 31, 1 << 40, 1 << 62, 1<<63 - 1, 1 << 63, ^uint64(0)}[b&7]
}

// flags maps a byte onto open flags.
func (e *fuzzEnv) flags() uint32 {
	b := e.Byte()
	fl := uint32(b & 3)
	for bit, f := range []int{unix.O_TRUNC, unix.O_APPEND, unix.O_EXCL, unix.O_CREAT, unix.O_DIRECTORY, unix.O_PATH | unix.O_NOFOLLOW | unix.O_SYNC} {
		if b&(4<<bit) != 0 {
			fl |= uint32(f)
		}
	}
	return fl
}

func (e *fuzzEnv) header(id uint64, caller byte) fuse.InHeader {
	h := hdr(id)
	switch caller {
	case 1:
		h.Uid, h.Gid = 1000, 1000
	case 2:
		h.Uid, h.Gid = 65534, 0
	case 3:
		h.Uid, h.Gid = ^uint32(0), ^uint32(0)
	}
	return h
}

// fuzzTempDir returns a new directory on /dev/shm if that is a tmpfs, where
// fsync and O_SYNC cost nothing, or else in the test's temporary directory.
func fuzzTempDir(t testing.TB) string {
	var fs unix.Statfs_t
	if unix.Statfs("/dev/shm", &fs) == nil && fs.Type == unix.TMPFS_MAGIC {
		if d, err := os.MkdirTemp("/dev/shm", "fuseserver-fuzz-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// newFuzzEnv makes the tree: base/outside/secret, and in base/root a
// directory, files, a FIFO and symlinks pointing out of the root.
func newFuzzEnv(t testing.TB, in []byte) *fuzzEnv {
	base := fuzzTempDir(t)
	e := &fuzzEnv{
		t: t, Reader: fuzzbytes.New(in), base: base, root: filepath.Join(base, "root"),
		secret:    filepath.Join(base, "outside", "secret"),
		ids:       []uint64{rootID},
		seenNodes: map[uint64]bool{rootID: true}, goneNodes: map[uint64]bool{},
		seenFhs: map[uint64]bool{}, goneFhs: map[uint64]bool{},
		watch: -1, reader: -1,
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(base, "outside"), 0o700))
	must(os.WriteFile(e.secret, []byte("secret"), 0o600))
	unix.Lsetxattr(e.secret, "user.sentinel", []byte("s"), 0)
	must(os.MkdirAll(filepath.Join(e.root, "a"), 0o755))
	must(os.WriteFile(filepath.Join(e.root, "a", "f"), []byte("hello"), 0o644))
	must(os.WriteFile(filepath.Join(e.root, "f"), []byte("data"), 0o644))
	must(os.Symlink("../outside", filepath.Join(e.root, "esc")))
	must(os.Symlink(e.secret, filepath.Join(e.root, "abs")))
	must(os.Symlink("..", filepath.Join(e.root, "up")))
	must(unix.Mkfifo(filepath.Join(e.root, "p"), 0o666))
	must(unix.Lstat(e.secret, &e.secretStat))
	must(unix.Lstat(filepath.Join(base, "outside"), &e.outStat))
	must(unix.Lstat(base, &e.baseStat))

	notify := fuzzNotify(t)
	e.drainOpens(false) // events of earlier inputs
	var err error
	e.watch, err = unix.InotifyAddWatch(notify, e.root, unix.IN_OPEN)
	must(err)
	e.reader, err = unix.Open(filepath.Join(e.root, "p"), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	must(err)
	e.drainOpens(false)
	e.fdStart = countFds(t)
	e.s, err = New(e.root)
	must(err)
	return e
}

// close releases every handle and the root fd, checks that the process is
// back to the fds it had before the server, and closes the watches.
func (e *fuzzEnv) close() {
	if e.s != nil {
		e.dropServer(e.s)
		e.s = nil
		if n := countFds(e.t); n != e.fdStart {
			e.t.Errorf("%d fds open after releasing everything, %d before the server", n, e.fdStart)
		}
	}
	if e.reader >= 0 {
		unix.Close(e.reader)
		e.reader = -1
	}
	if e.watch >= 0 {
		unix.InotifyRmWatch(fuzzNotify(e.t), uint32(e.watch))
		e.watch = -1
	}
}

// dropServer releases all of s's handles and closes its root.
func (e *fuzzEnv) dropServer(s *Server) {
	s.mu.Lock()
	hs := make([]*handle, 0, len(s.handles))
	for _, h := range s.handles {
		hs = append(hs, h)
	}
	s.mu.Unlock()
	for _, h := range hs {
		s.release(h.id, h.dir)
	}
	if len(s.handles) != 0 {
		e.t.Errorf("%d handles left after releasing all", len(s.handles))
	}
	unix.Close(s.rootFd)
}

// countFds counts the process's open fds, its own listing fd included.
func countFds(t testing.TB) int {
	fd, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var buf [8192]byte
	count := 0
	for {
		n, err := unix.Getdents(fd, buf[:])
		if err != nil {
			t.Fatal(err)
		}
		if n <= 0 {
			return count - 2 // "." and ".."
		}
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				break
			}
			count++
			b = b[reclen:]
		}
	}
}

// The inotify instance shared by all inputs: closing one waits for an RCU
// grace period, too slow to do per input. It stays open.
var (
	notifyOnce sync.Once
	notifyFd   int
	notifyErr  error
)

func fuzzNotify(t testing.TB) int {
	notifyOnce.Do(func() {
		notifyFd, notifyErr = unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	})
	if notifyErr != nil {
		t.Fatal(notifyErr)
	}
	return notifyFd
}

// drainOpens reads the inotify queue and, if report is set, fails for any
// open of a FIFO, socket or device node in the root.
func (e *fuzzEnv) drainOpens(report bool) {
	var buf [4096]byte
	for {
		n, err := unix.Read(fuzzNotify(e.t), buf[:])
		if n <= 0 || err != nil {
			return
		}
		b := buf[:n]
		for len(b) >= unix.SizeofInotifyEvent {
			wd := int(int32(binary.NativeEndian.Uint32(b[0:4])))
			mask := binary.NativeEndian.Uint32(b[4:8])
			l := int(binary.NativeEndian.Uint32(b[12:16]))
			if unix.SizeofInotifyEvent+l > len(b) {
				break
			}
			name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l], "\x00"))
			b = b[unix.SizeofInotifyEvent+l:]
			if !report || wd != e.watch || mask&unix.IN_OPEN == 0 || mask&unix.IN_ISDIR != 0 || name == "" {
				continue
			}
			var st unix.Stat_t
			if unix.Lstat(filepath.Join(e.root, name), &st) == nil {
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFREG, unix.S_IFDIR:
				default:
					e.t.Errorf("server opened %s, of mode %o", name, st.Mode)
				}
			}
		}
	}
}

// gotNode records a node id the server answered.
func (e *fuzzEnv) gotNode(id uint64) {
	if id == 0 {
		return
	}
	if e.goneNodes[id] {
		e.t.Fatalf("node id %d answered again after it was dropped", id)
	}
	if !e.seenNodes[id] {
		e.seenNodes[id] = true
		if len(e.ids) < 256 {
			e.ids = append(e.ids, id)
		}
	}
}

// gotFh records a handle the server answered.
func (e *fuzzEnv) gotFh(fh uint64) {
	if e.goneFhs[fh] || e.seenFhs[fh] {
		e.t.Fatalf("handle %d answered twice", fh)
	}
	e.seenFhs[fh] = true
	e.fhs = append(e.fhs, fh)
}

// check verifies the tables and the fd count after one operation.
func (e *fuzzEnv) check() {
	s := e.s
	s.mu.Lock()
	live := 1 // the root fd
	open := map[uint64]int{}
	for fh, h := range s.handles {
		if h.id != fh || fh >= s.nextHandle {
			e.t.Errorf("handle %d: id %d, next %d", fh, h.id, s.nextHandle)
		}
		if s.nodes[h.node] == nil {
			e.t.Errorf("handle %d refers to node %d, not in the table", fh, h.node)
		}
		open[h.node]++
		if h.fd >= 0 {
			live++
		}
	}
	if r := s.nodes[rootID]; r == nil || r.parent != nil {
		e.t.Errorf("root node missing or attached")
	}
	for id, n := range s.nodes {
		if n.id != id || (id != rootID && id >= s.nextNode) {
			e.t.Errorf("node %d: id %d, next %d", id, n.id, s.nextNode)
		}
		if n.open != open[id] {
			e.t.Errorf("node %d: open %d, handles %d", id, n.open, open[id])
		}
		if id != rootID && n.nlookup == 0 && n.open == 0 && len(n.children) == 0 {
			e.t.Errorf("node %d (%q) stays with no lookup, handle or child", id, n.name)
		}
		if p := n.parent; p != nil && (p.children[n.name] != n || s.nodes[p.id] != p) {
			e.t.Errorf("node %d (%q): parent %d does not hold it", id, n.name, p.id)
		}
		for name, c := range n.children {
			if c.parent != n || c.name != name || s.nodes[c.id] != c {
				e.t.Errorf("node %d: child %q (%d) not linked back or not in the table", id, name, c.id)
			}
			if !validName(name).Ok() {
				e.t.Errorf("node %d: child name %q", id, name)
			}
		}
		steps := 0
		for p := n; p != nil; p = p.parent {
			if steps++; steps > len(s.nodes)+1 {
				e.t.Fatalf("node %d: parent chain has a cycle", id)
			}
		}
	}
	for id := range e.seenNodes {
		if s.nodes[id] == nil {
			e.goneNodes[id] = true
		}
	}
	for fh := range e.seenFhs {
		if s.handles[fh] == nil {
			e.goneFhs[fh] = true
		}
	}
	s.mu.Unlock()
	if n := countFds(e.t); n != e.fdStart+live {
		e.t.Fatalf("%d fds open, want %d before the server + %d (root and handles)", n, e.fdStart, live)
	}
	e.drainOpens(true)
}

// step decodes and runs one operation.
func (e *fuzzEnv) step() fuse.Status {
	s := e.s
	op := e.Byte()
	caller := op >> 5 & 3
	var eo fuse.EntryOut
	var ao fuse.AttrOut
	var oo fuse.OpenOut
	switch op & 31 {
	case opLookup:
		h := e.header(e.node(), caller)
		code := s.Lookup(never, &h, e.name(), &eo)
		if code.Ok() {
			e.gotNode(eo.NodeId)
		}
		return code
	case opGetAttr:
		in := fuse.GetAttrIn{InHeader: e.header(e.node(), caller)}
		if b := e.Byte(); b&1 != 0 {
			in.Flags_ = fuse.FUSE_GETATTR_FH
			in.Fh_ = e.fh()
		}
		return s.GetAttr(never, &in, &ao)
	case opSetAttr:
		in := fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: e.header(e.node(), caller)}}
		v := e.Byte()
		for bit, f := range []uint32{fuse.FATTR_MODE, fuse.FATTR_UID, fuse.FATTR_GID, fuse.FATTR_SIZE,
			fuse.FATTR_ATIME, fuse.FATTR_MTIME, fuse.FATTR_FH, fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW} {
			if v&(1<<bit) != 0 {
				in.Valid |= f
			}
		}
		in.Mode = uint32(e.U16())
		owner := uint32(e.Byte())
		in.Uid, in.Gid = owner*1000, owner
		in.Size = e.off()
		in.Atime, in.Mtime = e.off(), e.off()
		in.Atimensec = uint32(e.U16()) * 20000 // past 1e9 from 50000 up
		in.Mtimensec = in.Atimensec
		in.Fh = e.fh()
		return s.SetAttr(never, &in, &ao)
	case opMkdir:
		in := fuse.MkdirIn{InHeader: e.header(e.node(), caller)}
		name := e.name()
		in.Mode = uint32(e.U16())
		code := s.Mkdir(never, &in, name, &eo)
		if code.Ok() {
			e.gotNode(eo.NodeId)
		}
		return code
	case opMknod:
		in := fuse.MknodIn{InHeader: e.header(e.node(), caller)}
		name := e.name()
		in.Mode = uint32(e.U16())
		in.Rdev = uint32(e.Byte()) | 1<<8
		code := s.Mknod(never, &in, name, &eo)
		if code.Ok() {
			e.gotNode(eo.NodeId)
		}
		return code
	case opCreate:
		in := fuse.CreateIn{InHeader: e.header(e.node(), caller)}
		name := e.name()
		in.Flags = e.flags()
		in.Mode = uint32(e.U16())
		var co fuse.CreateOut
		code := s.Create(never, &in, name, &co)
		if code.Ok() {
			e.gotNode(co.NodeId)
			e.gotFh(co.Fh)
		}
		return code
	case opOpen, opOpenDir:
		in := fuse.OpenIn{InHeader: e.header(e.node(), caller), Flags: e.flags()}
		var code fuse.Status
		if op&31 == opOpen {
			code = s.Open(never, &in, &oo)
		} else {
			code = s.OpenDir(never, &in, &oo)
		}
		if code.Ok() {
			e.gotFh(oo.Fh)
		}
		return code
	case opRead:
		in := fuse.ReadIn{Fh: e.fh(), Offset: e.off(), Size: uint32(e.Byte()) * 64}
		buf := make([]byte, 1<<14)
		r, code := s.Read(never, &in, buf)
		if code.Ok() {
			if b, _ := r.Bytes(buf); len(b) > int(in.Size) {
				e.t.Errorf("read of %d bytes answered %d", in.Size, len(b))
			}
		}
		return code
	case opWrite:
		in := fuse.WriteIn{Fh: e.fh(), Offset: e.off()}
		data := e.Take(int(e.Byte()) % 65)
		in.Size = uint32(len(data))
		_, code := s.Write(never, &in, data)
		return code
	case opRelease:
		s.Release(never, &fuse.ReleaseIn{Fh: e.fh()})
		return fuse.OK
	case opReleaseDir:
		s.ReleaseDir(&fuse.ReleaseIn{Fh: e.fh()})
		return fuse.OK
	case opUnlink, opRmdir:
		h := e.header(e.node(), caller)
		if op&31 == opUnlink {
			return s.Unlink(never, &h, e.name())
		}
		return s.Rmdir(never, &h, e.name())
	case opRename:
		in := fuse.RenameIn{InHeader: e.header(e.node(), caller)}
		oldName := e.name()
		in.Newdir = e.node()
		newName := e.name()
		fb := e.Byte()
		in.Flags = uint32(fb & 3) // RENAME_NOREPLACE, RENAME_EXCHANGE
		if fb&4 != 0 {
			in.Flags |= unix.RENAME_WHITEOUT
		}
		if fb&8 != 0 {
			in.Flags |= uint32(fb) << 24
		}
		return s.Rename(never, &in, oldName, newName)
	case opLink:
		in := fuse.LinkIn{Oldnodeid: e.node()}
		in.InHeader = e.header(e.node(), caller)
		code := s.Link(never, &in, e.name(), &eo)
		if code.Ok() {
			e.gotNode(eo.NodeId)
		}
		return code
	case opSymlink:
		h := e.header(e.node(), caller)
		name := e.name()
		target := e.base
		if b := e.Byte(); b < 0xf0 {
			target = fuzzTargets[int(b)%len(fuzzTargets)]
		} else if b&1 != 0 {
			target = e.secret
		}
		code := s.Symlink(never, &h, target, name, &eo)
		if code.Ok() {
			e.gotNode(eo.NodeId)
		}
		return code
	case opReadlink:
		h := e.header(e.node(), caller)
		_, code := s.Readlink(never, &h)
		return code
	case opReadDir, opReadDirPlus:
		in := fuse.ReadIn{Fh: e.fh(), Offset: e.off(), Size: uint32(e.Byte())*32 + 32}
		ents, outs, code, err := readDir(s, &in, op&31 == opReadDirPlus)
		if !code.Ok() {
			return code
		}
		if err != nil {
			e.t.Fatalf("readdir answer does not parse: %v", err)
		}
		for _, ent := range ents {
			if ent.Name != "." && ent.Name != ".." && !validName(ent.Name).Ok() {
				e.t.Errorf("readdir lists %q", ent.Name)
			}
		}
		for _, o := range outs {
			e.gotNode(o.NodeId)
		}
		return code
	case opSetXAttr:
		in := fuse.SetXAttrIn{InHeader: e.header(e.node(), caller)}
		attr := fuzzXNames[int(e.Byte())%len(fuzzXNames)]
		in.Flags = uint32(e.Byte()) & 7
		data := e.Take(int(e.Byte()) % 33)
		in.Size = uint32(len(data))
		return s.SetXAttr(never, &in, attr, data)
	case opGetXAttr:
		h := e.header(e.node(), caller)
		attr := fuzzXNames[int(e.Byte())%len(fuzzXNames)]
		_, code := s.GetXAttr(never, &h, attr, make([]byte, e.Byte()))
		return code
	case opListXAttr:
		h := e.header(e.node(), caller)
		_, code := s.ListXAttr(never, &h, make([]byte, e.Byte()))
		return code
	case opRemoveXAttr:
		h := e.header(e.node(), caller)
		return s.RemoveXAttr(never, &h, fuzzXNames[int(e.Byte())%len(fuzzXNames)])
	case opStatFs:
		h := e.header(e.node(), caller)
		var out fuse.StatfsOut
		return s.StatFs(never, &h, &out)
	case opForget:
		id := e.node()
		n := e.off()
		s.Forget(id, n)
		return fuse.OK
	case opAccess:
		in := fuse.AccessIn{InHeader: e.header(e.node(), caller), Mask: uint32(e.Byte())}
		return s.Access(never, &in)
	case opFsync:
		fh := e.fh()
		switch b := e.Byte(); b % 4 {
		case 0:
			return s.Flush(never, &fuse.FlushIn{Fh: fh})
		case 1:
			return s.FsyncDir(never, &fuse.FsyncIn{Fh: fh, FsyncFlags: uint32(b >> 2)})
		default:
			return s.Fsync(never, &fuse.FsyncIn{Fh: fh, FsyncFlags: uint32(b >> 2)})
		}
	case opLseek:
		in := fuse.LseekIn{Fh: e.fh(), Offset: e.off(), Whence: uint32(e.Byte() % 8)}
		var out fuse.LseekOut
		return s.Lseek(never, &in, &out)
	case opFallocate:
		in := fuse.FallocateIn{Fh: e.fh(), Mode: uint32(e.Byte()), Offset: e.off(), Length: uint64(e.Byte()) * 512}
		return s.Fallocate(never, &in)
	case opCopyFileRange:
		in := fuse.CopyFileRangeIn{FhIn: e.fh(), FhOut: e.fh(), OffIn: e.off(), OffOut: e.off(), Len: uint64(e.Byte()) * 256}
		if b := e.Byte(); b >= 0xf0 {
			in.Flags = uint64(b)
		}
		_, code := s.CopyFileRange(never, &in)
		return code
	case opMove:
		state, err := s.Export()
		if err != nil {
			e.t.Fatalf("export: %v", err)
		}
		e.dropServer(s)
		e.s = nil
		s2, err := New(e.root)
		if err != nil {
			e.t.Fatal(err)
		}
		e.s = s2
		if err := s2.Import(state); err != nil {
			e.t.Fatalf("import of an export: %v", err)
		}
		return fuse.OK
	}
	return fuse.ENOSYS
}

// run decodes and runs up to fuzzMaxOps operations, checking after each.
func (e *fuzzEnv) run() {
	for i := 0; i < fuzzMaxOps && e.Len() > 0; i++ {
		e.codes = append(e.codes, e.step())
		e.check()
	}
	if _, err := e.s.Export(); err != nil {
		e.t.Fatalf("export: %v", err)
	}
}

// checkOutside fails if anything outside the root changed or a device node
// appeared in the root.
func (e *fuzzEnv) checkOutside(watched map[string]bool) {
	t := e.t
	same := func(what string, a, b *unix.Stat_t) {
		if a.Ino != b.Ino || a.Mode != b.Mode || a.Uid != b.Uid || a.Gid != b.Gid || a.Size != b.Size ||
			a.Nlink != b.Nlink || a.Mtim != b.Mtim || a.Ctim != b.Ctim {
			t.Errorf("%s changed: %+v -> %+v", what, *a, *b)
		}
	}
	var st unix.Stat_t
	for what, p := range map[string]string{"secret": e.secret, "outside": filepath.Dir(e.secret), "base": e.base} {
		before := map[string]*unix.Stat_t{"secret": &e.secretStat, "outside": &e.outStat, "base": &e.baseStat}[what]
		if err := unix.Lstat(p, &st); err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		same(what, before, &st)
	}
	if b, err := os.ReadFile(e.secret); err != nil || string(b) != "secret" {
		t.Errorf("secret now holds %q (%v)", b, err)
	}
	xa := make([]byte, 256)
	if n, err := unix.Llistxattr(e.secret, xa); err == nil && string(xa[:n]) != "user.sentinel\x00" {
		t.Errorf("secret's xattrs now %q", xa[:n])
	}
	for dir, want := range map[string][]string{e.base: {"outside", "root"}, filepath.Dir(e.secret): {"secret"}} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, ent := range ents {
			names = append(names, ent.Name())
		}
		if !slices.Equal(names, want) {
			t.Errorf("%s lists %q, want %q", dir, names, want)
		}
	}
	for p := range watched {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s made outside the root", p)
			os.RemoveAll(p)
		}
	}
	filepath.WalkDir(e.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeDevice != 0 {
			t.Errorf("device node %s in the root", p)
		}
		return nil
	})
}

// outsidePaths lists the tree's names in the working directory and in "/"
// that do not exist yet, where a path that escaped as relative or absolute
// would land.
func outsidePaths(t testing.TB) map[string]bool {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, dir := range []string{"/", wd, os.TempDir()} {
		for _, name := range append(slices.Clone(fuzzNames), "stolen") {
			p := filepath.Join(dir, name)
			if _, err := os.Lstat(p); err != nil {
				m[p] = true
			}
		}
	}
	return m
}

// runFuzzServer runs one input against a fresh tree and returns the answers.
func runFuzzServer(t testing.TB, data []byte, watched map[string]bool) []fuse.Status {
	e := newFuzzEnv(t, data)
	defer e.close()
	e.run()
	e.close()
	e.checkOutside(watched)
	return e.codes
}

// fuzzSeeds are meaningful sequences, each with the answers it gets. Node
// byte 0 is the root; nodes and handles are indexed in the order answered.
var fuzzSeeds = []struct {
	name string
	in   []byte
	want []fuse.Status
}{
	{"create write read release", []byte{
		opCreate, 0, 1, 2, 0xa4, 0x01, // root/b, O_RDWR, 0644 -> node 1, fh 0
		opWrite, 0, 0, 5, 'h', 'e', 'l', 'l', 'o',
		opRead, 0, 0, 1,
		opRelease, 0,
		opRead, 0, 0, 1,
	}, []fuse.Status{fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.EBADF}},
	{"symlink then lookup through it", []byte{
		opSymlink, 0, 2, 3, // root/c -> ../outside -> node 1
		opLookup, 1, 8, // c/secret
		opOpenDir, 1, 0,
		opLookup, 0, 4, // root/esc -> node 2
		opLookup, 2, 8, // esc/secret
		opMkdir, 2, 8, 0xed, 0x01,
		opOpen, 2, 2,
		opSetAttr, 2, 1, 0xff, 0x01, 0, 0, 0, 0, 0, 0, 0,
	}, []fuse.Status{fuse.OK, fuse.ENOTDIR, fuse.ENOTDIR, fuse.OK, fuse.ENOTDIR, fuse.ENOTDIR, fuse.Status(unix.ELOOP), fuse.Status(unix.EOPNOTSUPP)}},
	{"rename over a directory", []byte{
		opMkdir, 0, 1, 0xed, 0x01, // root/b -> node 1
		opMkdir, 0, 2, 0xed, 0x01, // root/c -> node 2
		opCreate, 2, 3, 1, 0xa4, 0x01, // c/f -> node 3, fh 0
		opRename, 0, 1, 0, 2, 0, // b over c: not empty
		opRename, 0, 2, 0, 1, 0, // c over b
		opGetAttr, 3, 0,
		opRename, 0, 1, 0, 0, 1, // b over a, RENAME_NOREPLACE
		opRename, 0, 1, 0, 0, 2, // b and a exchanged
		opWrite, 0, 0, 1, 'x',
		opRelease, 0,
		opForget, 3, 1,
	}, []fuse.Status{fuse.OK, fuse.OK, fuse.OK, fuse.Status(unix.ENOTEMPTY), fuse.OK, fuse.OK, fuse.Status(unix.EEXIST), fuse.OK, fuse.OK, fuse.OK, fuse.OK}},
	{"mkdir then rmdir", []byte{
		opMkdir, 0, 1, 0xed, 0x01,
		opOpenDir, 1, 0,
		opReadDirPlus, 0, 0, 16,
		opRmdir, 0, 1,
		opReadDir, 0, 0, 16, // a removed directory lists nothing
		opReleaseDir, 0,
		opGetAttr, 1, 0,
		opForget, 1, 1,
		opGetAttr, 1, 0,
	}, []fuse.Status{fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.ENOENT, fuse.OK, fuse.ENOENT, fuse.OK, fuse.ENOENT}},
	{"fifo, device and truncate", []byte{
		opLookup, 0, 7, // root/p, a FIFO -> node 1
		opOpen, 1, 1,
		opSetAttr, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, // size 0
		opMknod, 0, 2, 0xb6, 0x21, 3, // char device c
		opMknod, 0, 2, 0xb6, 0x11, 0, // FIFO c
		opMove,
		opGetAttr, 1, 0,
	}, []fuse.Status{fuse.OK, fuse.EPERM, fuse.EINVAL, fuse.EPERM, fuse.OK, fuse.OK, fuse.OK}},
	{"xattrs and hard links", []byte{
		opLookup, 0, 5, // root/abs -> node 1
		opSetXAttr, 1, 0, 0, 1, 'v',
		opLink, 1, 0, 1, // root/b, a hard link of the symlink abs -> node 2
		opSetXAttr, 0, 0, 0, 1, 'v',
		opGetXAttr, 0, 0, 16,
		opListXAttr, 0, 1,
		opRemoveXAttr, 0, 0,
		opStatFs, 0,
	}, []fuse.Status{fuse.OK, fuse.EPERM, fuse.OK, fuse.OK, fuse.OK, fuse.ERANGE, fuse.OK, fuse.OK}},
	{"handles across a move", []byte{
		opCreate, 0, 1, 2, 0xa4, 0x01, // root/b, O_RDWR -> node 1, fh 0
		opWrite, 0, 0, 3, 'a', 'b', 'c',
		opSetAttr, 1, 104, 0, 0, 0, 10, 0, 5, 0, 0, 0, // size 10 and mtime through fh 0
		opSetAttr, 1, 8, 0, 0, 0, 2, 0, 0, 0, 0, 0, // size 2 by name
		opFsync, 0, 2,
		opFsync, 0, 1, // FSYNCDIR of a file handle
		opLseek, 0, 0, 3, // SEEK_DATA
		opFallocate, 0, 0, 0, 1,
		opCopyFileRange, 0, 0, 0, 0xf8, 1, 0,
		opOpenDir, 0, 0, // fh 1
		opMove,
		opRead, 0, 0, 1,
		opReadDirPlus, 1, 0, 16,
		opRelease, 0,
		opReleaseDir, 1,
	}, []fuse.Status{fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.EBADF, fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.OK, fuse.OK}},
}

// TestFuzzServerSeeds checks that the seeds do what their names say.
func TestFuzzServerSeeds(t *testing.T) {
	watched := outsidePaths(t)
	for _, sd := range fuzzSeeds {
		t.Run(sd.name, func(t *testing.T) {
			if got := runFuzzServer(t, sd.in, watched); !slices.Equal(got, sd.want) {
				t.Errorf("answers %v, want %v", got, sd.want)
			}
		})
	}
}

// FuzzServer drives a Server over a small tree with a sequence of decoded
// operations and checks that nothing outside the root changes, no device
// node appears, no FIFO is opened, ids are not reused, the tables stay
// consistent, and every fd is accounted for and closed at the end.
func FuzzServer(f *testing.F) {
	for _, sd := range fuzzSeeds {
		f.Add(sd.in)
	}
	watched := outsidePaths(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		runFuzzServer(t, data, watched)
	})
}
