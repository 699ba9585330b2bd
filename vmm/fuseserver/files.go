package fuseserver

import (
	"sync"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// handle is one open file or directory. An imported handle has fd -1 until
// its first use reopens it by path.
type handle struct {
	id    uint64
	node  uint64
	flags uint32
	dir   bool

	mu     sync.RWMutex // read-held while fd is in use; held to open or close it
	fd     int
	closed bool

	listMu  sync.Mutex      // guards entries
	entries []fuse.DirEntry // directory listing, read at the first READDIR
}

// openFlags keeps the guest's open flags that mean something to a host fd.
const openFlags = unix.O_ACCMODE | unix.O_APPEND | unix.O_TRUNC | unix.O_SYNC | unix.O_DSYNC

// reopenDrop are the flags a reopen must not repeat.
const reopenDrop = unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC

// openFile opens the regular file name in dfd with the guest's flags. It
// never follows a symlink and never opens anything but a regular file.
func openFile(dfd int, name string, flags uint32) (int, fuse.Status) {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, fuse.ToStatus(err)
	}
	if code := regular(st.Mode); !code.Ok() {
		return -1, code
	}
	fd, err := unix.Openat(dfd, name, int(flags)&openFlags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fuse.ToStatus(err)
	}
	if err := unix.Fstat(fd, &st); err != nil || !regular(st.Mode).Ok() {
		unix.Close(fd)
		return -1, fuse.EPERM
	}
	return fd, fuse.OK
}

// regular answers OK for a regular file, EISDIR for a directory, ELOOP for a
// symlink and EPERM for anything else.
func regular(mode uint32) fuse.Status {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return fuse.OK
	case unix.S_IFDIR:
		return fuse.EISDIR
	case unix.S_IFLNK:
		return fuse.Status(unix.ELOOP)
	}
	return fuse.EPERM
}

// register adds an open fd of node id as a new handle; it fails (closing fd)
// if the node was forgotten meanwhile.
func (s *Server) register(id uint64, fd int, flags uint32, dir bool) (uint64, fuse.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[id]
	if n == nil {
		unix.Close(fd)
		return 0, fuse.ENOENT
	}
	h := &handle{id: s.nextHandle, node: id, flags: flags, dir: dir, fd: fd}
	s.nextHandle++
	s.handles[h.id] = h
	n.open++
	return h.id, fuse.OK
}

// useHandle returns handle fh's fd, reopening an imported handle at its
// first use, with h.mu read-held: the caller must h.mu.RUnlock().
func (s *Server) useHandle(fh uint64, dir bool) (*handle, int, fuse.Status) {
	s.mu.Lock()
	h := s.handles[fh]
	s.mu.Unlock()
	if h == nil || h.dir != dir {
		return nil, -1, fuse.EBADF
	}
	h.mu.RLock()
	if h.fd >= 0 {
		return h, h.fd, fuse.OK
	}
	h.mu.RUnlock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, -1, fuse.EBADF
	}
	if h.fd < 0 {
		fd, code := s.reopen(h)
		if !code.Ok() {
			h.mu.Unlock()
			return nil, -1, code
		}
		h.fd = fd
	}
	h.mu.Unlock()
	h.mu.RLock()
	if h.fd < 0 {
		h.mu.RUnlock()
		return nil, -1, fuse.EBADF
	}
	return h, h.fd, fuse.OK
}

// reopen opens an imported handle's node by its path with the saved flags.
// A node that has no path, or no file there, answers EIO.
func (s *Server) reopen(h *handle) (int, fuse.Status) {
	dfd, name, code := s.locate(h.node)
	if !code.Ok() {
		return -1, fuse.EIO
	}
	defer s.closeDir(dfd)
	if h.dir {
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fuse.EIO
		}
		return fd, fuse.OK
	}
	fd, code := openFile(dfd, name, h.flags&^reopenDrop)
	if !code.Ok() {
		return -1, fuse.EIO
	}
	return fd, fuse.OK
}

// anyHandle returns an open file handle of node id, read-held as useHandle.
func (s *Server) anyHandle(id uint64) (*handle, int, fuse.Status) {
	s.mu.Lock()
	var fhs []uint64
	if n := s.nodes[id]; n != nil && n.open > 0 {
		for fh, h := range s.handles {
			if h.node == id && !h.dir {
				fhs = append(fhs, fh)
			}
		}
	}
	s.mu.Unlock()
	for _, fh := range fhs {
		if h, fd, code := s.useHandle(fh, false); code.Ok() {
			return h, fd, code
		}
	}
	return nil, -1, fuse.ENOENT
}

// release drops handle fh and closes its fd.
func (s *Server) release(fh uint64, dir bool) {
	s.mu.Lock()
	h := s.handles[fh]
	if h == nil || h.dir != dir {
		s.mu.Unlock()
		return
	}
	delete(s.handles, fh)
	if n := s.nodes[h.node]; n != nil {
		n.open--
		s.maybeRemove(n)
	}
	s.mu.Unlock()
	h.mu.Lock()
	if h.fd >= 0 {
		unix.Close(h.fd)
	}
	h.fd = -1
	h.closed = true
	h.mu.Unlock()
}

// Open opens a regular file. Anything else answers EPERM (EISDIR for a
// directory, ELOOP for a symlink): FIFOs and devices are never opened.
func (s *Server) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	dfd, name, code := s.locate(in.NodeId)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	fd, code := openFile(dfd, name, in.Flags)
	if !code.Ok() {
		return code
	}
	fh, code := s.register(in.NodeId, fd, in.Flags, false)
	out.Fh = fh
	return code
}

// Create makes and opens a regular file, owned by the caller when new.
func (s *Server) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	p, dfd, code := s.dirFor(in.NodeId, name)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	fd := -1
	for try := 0; fd < 0; try++ {
		var err error
		fd, err = unix.Openat(dfd, name, int(in.Flags)&openFlags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, in.Mode&07777)
		if err == nil {
			if err := own(dfd, name, fd, &in.Caller, in.Mode, false); err != nil {
				unix.Close(fd)
				unix.Unlinkat(dfd, name, 0)
				return fuse.ToStatus(err)
			}
			break
		}
		if err != unix.EEXIST || in.Flags&unix.O_EXCL != 0 || try == 3 {
			return fuse.ToStatus(err)
		}
		fd, code = openFile(dfd, name, in.Flags)
		if !code.Ok() && code != fuse.ENOENT {
			return code
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fuse.ToStatus(err)
	}
	id := s.addChild(p, name)
	fh, code := s.register(id, fd, in.Flags, false)
	if !code.Ok() {
		return code
	}
	fillEntry(&out.EntryOut, id, &st)
	out.OpenOut.Fh = fh
	return fuse.OK
}

// Read reads from an open file at an offset.
func (s *Server) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	h, fd, code := s.useHandle(in.Fh, false)
	if !code.Ok() {
		return nil, code
	}
	defer h.mu.RUnlock()
	if int(in.Size) < len(buf) {
		buf = buf[:in.Size]
	}
	n, err := unix.Pread(fd, buf, int64(in.Offset))
	if err != nil {
		return nil, fuse.ToStatus(err)
	}
	return fuse.ReadResultData(buf[:n]), fuse.OK
}

// Write writes at an offset (at the end for a handle opened O_APPEND).
func (s *Server) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	return s.Writev(cancel, in, [][]byte{data})
}

// Writev writes the pieces of one WRITE request at an offset.
func (s *Server) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	h, fd, code := s.useHandle(in.Fh, false)
	if !code.Ok() {
		return 0, code
	}
	defer h.mu.RUnlock()
	n, err := unix.Pwritev(fd, data, int64(in.Offset))
	if err != nil {
		return 0, fuse.ToStatus(err)
	}
	return uint32(n), fuse.OK
}

// Flush checks that the handle exists; data is already with the host
// kernel, and an imported handle is not reopened for it.
func (s *Server) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	s.mu.Lock()
	h := s.handles[in.Fh]
	s.mu.Unlock()
	if h == nil || h.dir {
		return fuse.EBADF
	}
	return fuse.OK
}

// Fsync flushes an open file to storage (data only when asked).
func (s *Server) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return s.fsync(in, false)
}

func (s *Server) fsync(in *fuse.FsyncIn, dir bool) fuse.Status {
	h, fd, code := s.useHandle(in.Fh, dir)
	if !code.Ok() {
		return code
	}
	defer h.mu.RUnlock()
	if in.FsyncFlags&1 != 0 {
		return fuse.ToStatus(unix.Fdatasync(fd))
	}
	return fuse.ToStatus(unix.Fsync(fd))
}

// Fallocate passes fallocate(2) through.
func (s *Server) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	h, fd, code := s.useHandle(in.Fh, false)
	if !code.Ok() {
		return code
	}
	defer h.mu.RUnlock()
	return fuse.ToStatus(unix.Fallocate(fd, in.Mode, int64(in.Offset), int64(in.Length)))
}

// Lseek answers SEEK_DATA and SEEK_HOLE (and the plain whences).
func (s *Server) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	switch in.Whence {
	case unix.SEEK_SET, unix.SEEK_CUR, unix.SEEK_END, unix.SEEK_DATA, unix.SEEK_HOLE:
	default:
		return fuse.EINVAL
	}
	h, fd, code := s.useHandle(in.Fh, false)
	if !code.Ok() {
		return code
	}
	defer h.mu.RUnlock()
	off, err := unix.Seek(fd, int64(in.Offset), int(in.Whence))
	if err != nil {
		return fuse.ToStatus(err)
	}
	out.Offset = uint64(off)
	return fuse.OK
}

// CopyFileRange copies between two open files in the host kernel, at most
// 1 GiB per request.
func (s *Server) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	if in.Flags != 0 {
		return 0, fuse.EINVAL
	}
	hin, fdIn, code := s.useHandle(in.FhIn, false)
	if !code.Ok() {
		return 0, code
	}
	defer hin.mu.RUnlock()
	fdOut := fdIn
	if in.FhOut != in.FhIn {
		hout, fd, code := s.useHandle(in.FhOut, false)
		if !code.Ok() {
			return 0, code
		}
		defer hout.mu.RUnlock()
		fdOut = fd
	}
	offIn, offOut := int64(in.OffIn), int64(in.OffOut)
	n, err := unix.CopyFileRange(fdIn, &offIn, fdOut, &offOut, int(min(in.Len, 1<<30)), 0)
	if err != nil {
		return 0, fuse.ToStatus(err)
	}
	return uint32(n), fuse.OK
}

// Release closes an open file; an unknown or never reopened handle is fine.
func (s *Server) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	s.release(in.Fh, false)
}

// futimens sets the times of an open fd (utimensat with a NULL path), which
// needs no /proc.
func futimens(fd int, ts []unix.Timespec) error {
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
