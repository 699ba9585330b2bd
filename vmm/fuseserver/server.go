package fuseserver

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// timeout is the entry and attribute validity given to the kernel.
const timeout = time.Second

// maxDepth bounds a node's distance from the root (PATH_MAX/2 components).
const maxDepth = 2048

// rootID is the root node's id; it is never forgotten.
const rootID = fuse.FUSE_ROOT_ID

// node is one name the kernel looked up. A node whose parent is nil (other
// than the root) is detached: unlinked, or replaced by a rename.
type node struct {
	id       uint64
	parent   *node
	name     string
	nlookup  uint64
	children map[string]*node
	open     int // handles referring to this node
}

// Server is a passthrough file system of one directory tree. It implements
// fuse.RawFileSystem; its tables move between processes with Export and Import.
type Server struct {
	fuse.RawFileSystem

	root   string // absolute path of the root directory
	rootFd int    // the root directory, every path operation is relative to it

	mu         sync.Mutex
	nodes      map[uint64]*node
	handles    map[uint64]*handle
	nextNode   uint64
	nextHandle uint64
}

// New returns a server of the directory root (an absolute path; in production
// "/" after a chroot).
func New(root string) (*Server, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("fuseserver: root %q is not absolute", root)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fuseserver: open root %s: %w", root, err)
	}
	s := &Server{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		root:          filepath.Clean(root),
		rootFd:        fd,
	}
	s.reset()
	return s, nil
}

// reset empties the tables down to the root node.
func (s *Server) reset() {
	s.nodes = map[uint64]*node{rootID: {id: rootID, nlookup: 1}}
	s.handles = map[uint64]*handle{}
	s.nextNode = rootID + 1
	s.nextHandle = 1
}

// String names the file system.
func (s *Server) String() string { return "tine-fuseserver" }

// validName refuses what cannot be one path component.
func validName(name string) fuse.Status {
	switch {
	case name == "" || name == "." || name == "..":
		return fuse.EINVAL
	case strings.ContainsAny(name, "/\x00"):
		return fuse.EINVAL
	case len(name) > 255:
		return fuse.Status(unix.ENAMETOOLONG)
	}
	return fuse.OK
}

// relPath returns n's path from the root ("." for the root); ok is false for
// a node that is detached or whose ancestor is. s.mu must be held.
func relPath(n *node) (string, bool) {
	var names []string
	for depth := 0; n.id != rootID; depth++ {
		if n.parent == nil || depth > maxDepth {
			return "", false
		}
		names = append(names, n.name)
		n = n.parent
	}
	if len(names) == 0 {
		return ".", true
	}
	for i, j := 0, len(names)-1; i < j; i, j = i+1, j-1 {
		names[i], names[j] = names[j], names[i]
	}
	return strings.Join(names, "/"), true
}

// openDir opens the directory at rel (from relPath) without following any
// symlink and without leaving the root. The root itself is s.rootFd; close
// with s.closeDir.
func (s *Server) openDir(rel string) (int, fuse.Status) {
	if rel == "." {
		return s.rootFd, fuse.OK
	}
	fd, err := unix.Openat2(s.rootFd, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if err == unix.ELOOP || err == unix.EXDEV {
			return -1, fuse.ENOENT
		}
		return -1, fuse.ToStatus(err)
	}
	return fd, fuse.OK
}

func (s *Server) closeDir(fd int) {
	if fd != s.rootFd && fd >= 0 {
		unix.Close(fd)
	}
}

// dirOf opens the directory node id (for operations on a name inside it).
func (s *Server) dirOf(id uint64) (*node, int, fuse.Status) {
	s.mu.Lock()
	n := s.nodes[id]
	if n == nil {
		s.mu.Unlock()
		return nil, -1, fuse.ENOENT
	}
	rel, ok := relPath(n)
	s.mu.Unlock()
	if !ok {
		return nil, -1, fuse.ENOENT
	}
	fd, st := s.openDir(rel)
	return n, fd, st
}

// dirFor checks name as one path component and opens the directory node
// id that it is to be found or made in.
func (s *Server) dirFor(id uint64, name string) (*node, int, fuse.Status) {
	if st := validName(name); !st.Ok() {
		return nil, -1, st
	}
	return s.dirOf(id)
}

// locate returns the directory holding node id and its name there; the root
// is (s.rootFd, "."). Close the fd with s.closeDir.
func (s *Server) locate(id uint64) (int, string, fuse.Status) {
	s.mu.Lock()
	n := s.nodes[id]
	if n == nil {
		s.mu.Unlock()
		return -1, "", fuse.ENOENT
	}
	if n.id == rootID {
		s.mu.Unlock()
		return s.rootFd, ".", fuse.OK
	}
	name := n.name
	var rel string
	ok := n.parent != nil
	if ok {
		rel, ok = relPath(n.parent)
	}
	s.mu.Unlock()
	if !ok {
		return -1, "", fuse.ENOENT
	}
	fd, st := s.openDir(rel)
	return fd, name, st
}

// addChild records one more lookup of name under parent and returns its id.
func (s *Server) addChild(parent *node, name string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := parent.children[name]
	if c == nil {
		c = &node{id: s.nextNode, parent: parent, name: name}
		s.nextNode++
		s.nodes[c.id] = c
		if parent.children == nil {
			parent.children = map[string]*node{}
		}
		parent.children[name] = c
	}
	c.nlookup++
	return c.id
}

// detach takes n out of the tree; it stays in the id table. s.mu must be held.
func (s *Server) detach(n *node) {
	if n.parent == nil {
		return
	}
	p := n.parent
	if p.children[n.name] == n {
		delete(p.children, n.name)
	}
	n.parent = nil
	s.maybeRemove(n)
	s.maybeRemove(p)
}

// attach puts n under parent as name. s.mu must be held; the slot is free.
func attach(n, parent *node, name string) {
	n.parent = parent
	n.name = name
	if parent.children == nil {
		parent.children = map[string]*node{}
	}
	parent.children[name] = n
}

// maybeRemove drops n, then its ancestors, from the tables once nothing
// refers to them. s.mu must be held.
func (s *Server) maybeRemove(n *node) {
	for n != nil && n.id != rootID && n.nlookup == 0 && len(n.children) == 0 && n.open == 0 {
		delete(s.nodes, n.id)
		p := n.parent
		if p != nil && p.children[n.name] == n {
			delete(p.children, n.name)
		}
		n.parent = nil
		n = p
	}
}

// childOf returns the node named name under parent id, if the table has one.
func (s *Server) childOf(parent uint64, name string) *node {
	if p := s.nodes[parent]; p != nil {
		return p.children[name]
	}
	return nil
}

// isAncestor reports whether a is b or one of b's ancestors. s.mu must be held.
func isAncestor(a, b *node) bool {
	for depth := 0; b != nil && depth <= maxDepth+1; depth++ {
		if a == b {
			return true
		}
		b = b.parent
	}
	return false
}

// fillEntry fills out for node id with attributes st.
func fillEntry(out *fuse.EntryOut, id uint64, st *unix.Stat_t) {
	out.NodeId = id
	out.Generation = 0
	out.SetEntryTimeout(timeout)
	out.SetAttrTimeout(timeout)
	fillAttr(&out.Attr, st)
}

// fillAttr copies a host stat into a FUSE attribute.
func fillAttr(a *fuse.Attr, st *unix.Stat_t) {
	*a = fuse.Attr{
		Ino:       st.Ino,
		Size:      uint64(st.Size),
		Blocks:    uint64(st.Blocks),
		Atime:     uint64(st.Atim.Sec),
		Atimensec: uint32(st.Atim.Nsec),
		Mtime:     uint64(st.Mtim.Sec),
		Mtimensec: uint32(st.Mtim.Nsec),
		Ctime:     uint64(st.Ctim.Sec),
		Ctimensec: uint32(st.Ctim.Nsec),
		Mode:      st.Mode,
		Nlink:     uint32(st.Nlink),
		Owner:     fuse.Owner{Uid: st.Uid, Gid: st.Gid},
		Rdev:      uint32(st.Rdev),
		Blksize:   uint32(st.Blksize),
	}
}

// Lookup finds name in the directory header.NodeId.
func (s *Server) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	p, dfd, code := s.dirFor(header.NodeId, name)
	if !code.Ok() {
		return code
	}
	defer s.closeDir(dfd)
	return s.lookupAt(p, dfd, name, out)
}

// lookupAt stats name in the open directory dfd of node p and records it.
func (s *Server) lookupAt(p *node, dfd int, name string, out *fuse.EntryOut) fuse.Status {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fuse.ToStatus(err)
	}
	fillEntry(out, s.addChild(p, name), &st)
	return fuse.OK
}

// Forget drops nlookup lookups of node id.
func (s *Server) Forget(id, nlookup uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[id]
	if n == nil || n.id == rootID {
		return
	}
	n.nlookup -= min(nlookup, n.nlookup)
	s.maybeRemove(n)
}

// sortedChildren lists n's children by name. s.mu must be held.
func sortedChildren(n *node) []*node {
	cs := make([]*node, 0, len(n.children))
	for _, c := range n.children {
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	return cs
}
