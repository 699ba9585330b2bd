package fuseserver

import (
	"bytes"
	"encoding/binary"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// OpenDir opens a directory.
func (s *Server) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	dfd, name, code := s.locate(in.NodeId)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ELOOP {
			err = unix.ENOTDIR
		}
		return fuse.ToStatus(err)
	}
	fh, code := s.register(in.NodeId, fd, in.Flags, true)
	out.Fh = fh
	return code
}

// ReadDir lists a directory from an offset.
func (s *Server) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return s.readDir(in, out, false)
}

// ReadDirPlus lists a directory from an offset, looking up each entry but
// "." and "..". An entry that vanished is listed without a node id.
func (s *Server) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return s.readDir(in, out, true)
}

// readDir serves entries from the handle's listing, read at the first call
// and again at offset 0. The offset of an entry is its index plus one.
func (s *Server) readDir(in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	h, fd, code := s.useHandle(in.Fh, true)
	if !code.Ok() {
		return code
	}
	defer h.mu.RUnlock()
	h.listMu.Lock()
	defer h.listMu.Unlock()
	if h.entries == nil || in.Offset == 0 {
		entries, err := listDir(fd)
		if err != nil {
			return fuse.ToStatus(err)
		}
		h.entries = entries
	}
	var dir *node
	if plus {
		s.mu.Lock()
		dir = s.nodes[h.node]
		s.mu.Unlock()
	}
	for i := in.Offset; i < uint64(len(h.entries)); i++ {
		e := h.entries[i]
		e.Off = i + 1
		if !plus {
			if !out.AddDirEntry(e) {
				break
			}
			continue
		}
		eo := out.AddDirLookupEntry(e)
		if eo == nil {
			break
		}
		if e.Name == "." || e.Name == ".." || dir == nil {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, e.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		fillEntry(eo, s.addChild(dir, e.Name), &st)
		out.FixMode(st.Mode)
	}
	return fuse.OK
}

// listDir reads a whole directory: "." and ".." first, then the rest in the
// host's order.
func listDir(fd int) ([]fuse.DirEntry, error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, err
	}
	entries := []fuse.DirEntry{{Name: ".", Mode: unix.S_IFDIR}, {Name: "..", Mode: unix.S_IFDIR}}
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return entries, nil
		}
		b := buf[:n]
		for len(b) >= 19 {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				break
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if nm := string(name); nm != "." && nm != ".." && nm != "" {
				entries = append(entries, fuse.DirEntry{
					Ino:  binary.NativeEndian.Uint64(b[0:8]),
					Mode: uint32(b[18]) << 12,
					Name: nm,
				})
			}
			b = b[reclen:]
		}
	}
}

// ReleaseDir closes a directory handle.
func (s *Server) ReleaseDir(in *fuse.ReleaseIn) {
	s.release(in.Fh, true)
}

// FsyncDir flushes a directory to storage.
func (s *Server) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return s.fsync(in, true)
}
