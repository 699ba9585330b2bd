package fuseserver

import (
	"path/filepath"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// target is where an attribute operation lands: an open fd, or a name in an
// open directory.
type target struct {
	fd   int
	dfd  int
	name string
}

// targetOf resolves node id, through handle fh when useFh is set; a detached
// node falls back to any of its open handles. Call done when finished.
func (s *Server) targetOf(id, fh uint64, useFh bool) (t target, done func(), code fuse.Status) {
	if useFh {
		if h, fd, st := s.useHandle(fh, false); st.Ok() {
			return target{fd: fd, dfd: -1}, h.mu.RUnlock, fuse.OK
		}
	}
	dfd, name, st := s.locate(id)
	if st.Ok() {
		return target{fd: -1, dfd: dfd, name: name}, func() { s.closeDir(dfd) }, fuse.OK
	}
	if h, fd, st2 := s.anyHandle(id); st2.Ok() {
		return target{fd: fd, dfd: -1}, h.mu.RUnlock, fuse.OK
	}
	return target{}, nil, st
}

func (t target) stat(st *unix.Stat_t) error {
	if t.fd >= 0 {
		return unix.Fstat(t.fd, st)
	}
	return unix.Fstatat(t.dfd, t.name, st, unix.AT_SYMLINK_NOFOLLOW)
}

// attr fills out with the target's attributes.
func (t target) attr(out *fuse.AttrOut) fuse.Status {
	var st unix.Stat_t
	if err := t.stat(&st); err != nil {
		return fuse.ToStatus(err)
	}
	out.SetTimeout(timeout)
	fillAttr(&out.Attr, &st)
	return fuse.OK
}

// GetAttr returns a node's attributes.
func (s *Server) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	t, done, code := s.targetOf(in.NodeId, in.Fh(), in.Flags()&fuse.FUSE_GETATTR_FH != 0)
	if !code.Ok() {
		return code
	}
	defer done()
	return t.attr(out)
}

// SetAttr changes mode, owner, size and times, then returns the attributes.
func (s *Server) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	fh, useFh := in.GetFh()
	t, done, code := s.targetOf(in.NodeId, fh, useFh)
	if !code.Ok() {
		return code
	}
	defer done()
	if mode, ok := in.GetMode(); ok {
		var err error
		if t.fd >= 0 {
			err = unix.Fchmod(t.fd, mode)
		} else {
			err = chmodAt(t.dfd, t.name, mode)
		}
		if err != nil {
			return fuse.ToStatus(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		var err error
		if t.fd >= 0 {
			err = unix.Fchown(t.fd, u, g)
		} else {
			err = unix.Fchownat(t.dfd, t.name, u, g, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return fuse.ToStatus(err)
		}
	}
	if size, ok := in.GetSize(); ok {
		if size > 1<<63-1 {
			return fuse.EINVAL
		}
		if err := t.truncate(int64(size)); err != nil {
			return fuse.ToStatus(err)
		}
	}
	if in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if in.Valid&fuse.FATTR_ATIME != 0 {
			ts[0] = timespec(in.Atime, in.Atimensec, in.Valid&fuse.FATTR_ATIME_NOW != 0)
		}
		if in.Valid&fuse.FATTR_MTIME != 0 {
			ts[1] = timespec(in.Mtime, in.Mtimensec, in.Valid&fuse.FATTR_MTIME_NOW != 0)
		}
		var err error
		if t.fd >= 0 {
			err = futimens(t.fd, ts)
		} else {
			err = unix.UtimesNanoAt(t.dfd, t.name, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return fuse.ToStatus(err)
		}
	}
	return t.attr(out)
}

func timespec(sec uint64, nsec uint32, now bool) unix.Timespec {
	if now {
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	}
	if nsec >= 1e9 {
		nsec = 1e9 - 1
	}
	return unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
}

// truncate sets the size through the fd, or through a fresh write-only open
// of the name that never follows a symlink nor opens a non-regular file: the
// type is checked before the open (a FIFO with a reader would open) and again
// on the fd.
func (t target) truncate(size int64) error {
	if t.fd >= 0 {
		return unix.Ftruncate(t.fd, size)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(t.dfd, t.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return unix.EISDIR
	case unix.S_IFLNK:
		return unix.ELOOP
	default:
		return unix.EINVAL
	}
	fd, err := unix.Openat(t.dfd, t.name, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return unix.EINVAL
	}
	return unix.Ftruncate(fd, size)
}

// chmodAt changes the mode of name in dfd, refusing a symlink.
func chmodAt(dfd int, name string, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.EOPNOTSUPP
	}
	err := unix.Fchmodat(dfd, name, mode&07777, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.EOPNOTSUPP || err == unix.ENOSYS { // no fchmodat2: checked above
		err = unix.Fchmodat(dfd, name, mode&07777, 0)
	}
	return err
}

// own gives a new file the caller's uid and gid (the parent's gid when the
// parent is set-group-id) and the exact mode asked for, undoing the
// server's umask. fd is the new file's fd, or -1 to work on the name.
func own(dfd int, name string, fd int, caller *fuse.Caller, mode uint32, symlink bool) error {
	var pst, st unix.Stat_t
	if err := unix.Fstat(dfd, &pst); err != nil {
		return err
	}
	if fd >= 0 {
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
	} else if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	uid, gid := int(caller.Uid), int(caller.Gid)
	if pst.Mode&unix.S_ISGID != 0 {
		gid = int(pst.Gid)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			mode |= unix.S_ISGID
		}
	}
	if uint32(uid) != st.Uid || uint32(gid) != st.Gid {
		var err error
		if fd >= 0 {
			err = unix.Fchown(fd, uid, gid)
		} else {
			err = unix.Fchownat(dfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return err
		}
	}
	if symlink {
		return nil
	}
	if fd >= 0 {
		return unix.Fchmod(fd, mode&07777)
	}
	return chmodAt(dfd, name, mode)
}

// made finishes a new name: ownership, then a lookup entry. On failure the
// name is removed again.
func (s *Server) made(p *node, dfd int, name string, caller *fuse.Caller, mode uint32, flags int, out *fuse.EntryOut) fuse.Status {
	if err := own(dfd, name, -1, caller, mode, mode&unix.S_IFMT == unix.S_IFLNK); err != nil {
		unix.Unlinkat(dfd, name, flags)
		return fuse.ToStatus(err)
	}
	return s.lookupAt(p, dfd, name, out)
}

// Mkdir makes a directory.
func (s *Server) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	p, dfd, code := s.dirFor(in.NodeId, name)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	if err := unix.Mkdirat(dfd, name, in.Mode&07777); err != nil {
		return fuse.ToStatus(err)
	}
	return s.made(p, dfd, name, &in.Caller, unix.S_IFDIR|in.Mode&07777, unix.AT_REMOVEDIR, out)
}

// Mknod makes a regular file, FIFO or socket; device nodes are refused.
func (s *Server) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	switch in.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFIFO, unix.S_IFSOCK:
	default:
		return fuse.EPERM
	}
	p, dfd, code := s.dirFor(in.NodeId, name)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	if err := unix.Mknodat(dfd, name, in.Mode&(unix.S_IFMT|07777), 0); err != nil {
		return fuse.ToStatus(err)
	}
	return s.made(p, dfd, name, &in.Caller, in.Mode, 0, out)
}

// Symlink makes linkName pointing to pointedTo; the server never follows it.
func (s *Server) Symlink(cancel <-chan struct{}, header *fuse.InHeader, pointedTo, linkName string, out *fuse.EntryOut) fuse.Status {
	if pointedTo == "" || len(pointedTo) >= unix.PathMax {
		return fuse.EINVAL
	}
	p, dfd, code := s.dirFor(header.NodeId, linkName)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	if err := unix.Symlinkat(pointedTo, dfd, linkName); err != nil {
		return fuse.ToStatus(err)
	}
	return s.made(p, dfd, linkName, &header.Caller, unix.S_IFLNK|0777, 0, out)
}

// Link makes newName in in.NodeId a hard link of node in.Oldnodeid.
func (s *Server) Link(cancel <-chan struct{}, in *fuse.LinkIn, newName string, out *fuse.EntryOut) fuse.Status {
	if st := validName(newName); !st.Ok() {
		return st
	}
	ofd, oname, code := s.locate(in.Oldnodeid)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(ofd)
	if oname == "." {
		return fuse.EPERM
	}
	p, dfd, code := s.dirOf(in.NodeId)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	if err := unix.Linkat(ofd, oname, dfd, newName, 0); err != nil {
		return fuse.ToStatus(err)
	}
	return s.lookupAt(p, dfd, newName, out)
}

// Readlink returns a symlink's target.
func (s *Server) Readlink(cancel <-chan struct{}, header *fuse.InHeader) ([]byte, fuse.Status) {
	dfd, name, code := s.locate(header.NodeId)
	if !code.Ok() {
		return nil, code
	}
	defer s.closeDir(dfd)
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dfd, name, buf)
	if err != nil {
		return nil, fuse.ToStatus(err)
	}
	return buf[:n], fuse.OK
}

// remove unlinks name in in.NodeId and detaches its node.
func (s *Server) remove(header *fuse.InHeader, name string, flags int) fuse.Status {
	_, dfd, code := s.dirFor(header.NodeId, name)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	if err := unix.Unlinkat(dfd, name, flags); err != nil {
		return fuse.ToStatus(err)
	}
	s.mu.Lock()
	if c := s.childOf(header.NodeId, name); c != nil {
		s.detach(c)
	}
	s.mu.Unlock()
	return fuse.OK
}

// Unlink removes a non-directory.
func (s *Server) Unlink(cancel <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	return s.remove(header, name, 0)
}

// Rmdir removes an empty directory.
func (s *Server) Rmdir(cancel <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	return s.remove(header, name, unix.AT_REMOVEDIR)
}

// Rename moves oldName in in.NodeId to newName in in.Newdir, passing
// RENAME_NOREPLACE and RENAME_EXCHANGE through.
func (s *Server) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	if st := validName(oldName); !st.Ok() {
		return st
	}
	if st := validName(newName); !st.Ok() {
		return st
	}
	if in.Flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return fuse.EINVAL
	}
	s.mu.Lock()
	src, np := s.childOf(in.NodeId, oldName), s.nodes[in.Newdir]
	if src != nil && np != nil && isAncestor(src, np) {
		s.mu.Unlock()
		return fuse.EINVAL
	}
	s.mu.Unlock()
	_, ofd, code := s.dirOf(in.NodeId)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(ofd)
	_, nfd, code := s.dirOf(in.Newdir)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(nfd)
	if err := unix.Renameat2(ofd, oldName, nfd, newName, uint(in.Flags)); err != nil {
		return fuse.ToStatus(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	op, np := s.nodes[in.NodeId], s.nodes[in.Newdir]
	if op == nil || np == nil {
		return fuse.OK
	}
	src, dst := op.children[oldName], np.children[newName]
	if src == dst {
		return fuse.OK
	}
	if src != nil {
		delete(op.children, oldName)
	}
	if dst != nil {
		delete(np.children, newName)
	}
	if in.Flags&unix.RENAME_EXCHANGE != 0 {
		if dst != nil && !isAncestor(dst, op) {
			attach(dst, op, oldName)
		} else if dst != nil {
			dst.parent = nil
			s.maybeRemove(dst)
		}
	} else if dst != nil {
		dst.parent = nil
		s.maybeRemove(dst)
	}
	if src != nil {
		if !isAncestor(src, np) {
			attach(src, np, newName)
		} else {
			src.parent = nil
			s.maybeRemove(src)
		}
	}
	s.maybeRemove(op)
	s.maybeRemove(np)
	return fuse.OK
}

// Access answers from mode bits for the caller's uid and primary gid; root
// may do anything but execute a file without any execute bit.
func (s *Server) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	t, done, code := s.targetOf(in.NodeId, 0, false)
	if !code.Ok() {
		return code
	}
	defer done()
	var st unix.Stat_t
	if err := t.stat(&st); err != nil {
		return fuse.ToStatus(err)
	}
	mask := in.Mask & 7
	if in.Uid == 0 {
		if mask&fuse.X_OK != 0 && st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Mode&0111 == 0 {
			return fuse.EACCES
		}
		return fuse.OK
	}
	perm := st.Mode & 7
	switch {
	case in.Uid == st.Uid:
		perm = st.Mode >> 6 & 7
	case in.Gid == st.Gid:
		perm = st.Mode >> 3 & 7
	}
	if mask&^perm != 0 {
		return fuse.EACCES
	}
	return fuse.OK
}

// StatFs reports the root's file system.
func (s *Server) StatFs(cancel <-chan struct{}, header *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	var st unix.Statfs_t
	if err := unix.Fstatfs(s.rootFd, &st); err != nil {
		return fuse.ToStatus(err)
	}
	*out = fuse.StatfsOut{
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree,
		Bsize: uint32(st.Bsize), NameLen: uint32(st.Namelen), Frsize: uint32(st.Frsize),
	}
	return fuse.OK
}

// hostPath returns node id's path on the host after checking that its
// parent resolves beneath the root without symlinks.
func (s *Server) hostPath(id uint64) (string, fuse.Status) {
	dfd, name, code := s.locate(id)
	if !code.Ok() {
		return "", code
	}
	s.closeDir(dfd)
	s.mu.Lock()
	n := s.nodes[id]
	var rel string
	ok := n != nil
	if ok {
		rel, ok = relPath(n)
	}
	s.mu.Unlock()
	if !ok || (name != "." && filepath.Base(rel) != name) {
		return "", fuse.ENOENT
	}
	return filepath.Join(s.root, rel), fuse.OK
}

// xattrSize converts a size answer, asking for the needed size on ERANGE.
func xattrSize(n int, err error, size func() (int, error)) (uint32, fuse.Status) {
	if err == unix.ERANGE {
		if m, err2 := size(); err2 == nil {
			return uint32(m), fuse.ERANGE
		}
	}
	if err != nil {
		return 0, fuse.ToStatus(err)
	}
	return uint32(n), fuse.OK
}

// GetXAttr reads an extended attribute of the node itself (never a symlink's target).
func (s *Server) GetXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	p, code := s.hostPath(header.NodeId)
	if !code.Ok() {
		return 0, code
	}
	n, err := unix.Lgetxattr(p, attr, dest)
	return xattrSize(n, err, func() (int, error) { return unix.Lgetxattr(p, attr, nil) })
}

// ListXAttr lists extended attribute names.
func (s *Server) ListXAttr(cancel <-chan struct{}, header *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	p, code := s.hostPath(header.NodeId)
	if !code.Ok() {
		return 0, code
	}
	n, err := unix.Llistxattr(p, dest)
	return xattrSize(n, err, func() (int, error) { return unix.Llistxattr(p, nil) })
}

// SetXAttr writes an extended attribute.
func (s *Server) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	p, code := s.hostPath(in.NodeId)
	if !code.Ok() {
		return code
	}
	return fuse.ToStatus(unix.Lsetxattr(p, attr, data, int(in.Flags)))
}

// RemoveXAttr removes an extended attribute.
func (s *Server) RemoveXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string) fuse.Status {
	p, code := s.hostPath(header.NodeId)
	if !code.Ok() {
		return code
	}
	return fuse.ToStatus(unix.Lremovexattr(p, attr))
}
