package cowfs

import (
	"context"
	"slices"
	"sort"
	"syscall"
)

// xattrNamespaces are the xattr namespaces cowfs keeps.
var xattrNamespaces = []string{"user.", "trusted.", "security."}

func xattrAllowed(name string) bool {
	for _, p := range xattrNamespaces {
		if len(name) > len(p) && name[:len(p)] == p {
			return true
		}
	}
	return false
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := n.cur().xattrs[attr]
	if !ok {
		return 0, syscall.ENODATA
	}
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if slices.Contains(xattrNamespaces, attr) {
		return syscall.EINVAL // a namespace with no name in it, as Linux answers
	}
	if !xattrAllowed(attr) {
		return syscall.EOPNOTSUPP
	}
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.bound() {
		return syscall.EROFS
	}
	if data == nil {
		data = []byte{}
	}
	return toErrno(b.setXattr(n.cur(), attr, data, flags))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.bound() {
		return syscall.EROFS
	}
	return toErrno(b.setXattr(n.cur(), attr, nil, 0))
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	b := n.b
	b.mu.Lock()
	defer b.mu.Unlock()
	in := n.cur()
	names := make([]string, 0, len(in.xattrs))
	for k := range in.xattrs {
		names = append(names, k)
	}
	sort.Strings(names)
	var buf []byte
	for _, k := range names {
		buf = append(append(buf, k...), 0)
	}
	if len(dest) == 0 {
		return uint32(len(buf)), 0
	}
	if len(dest) < len(buf) {
		return uint32(len(buf)), syscall.ERANGE
	}
	return uint32(copy(dest, buf)), 0
}
