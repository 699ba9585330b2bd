package fuseserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// MaxState bounds an exported state (64 MiB); Import refuses more.
const MaxState = 64 << 20

// stateMagic starts an exported state; its last byte is the format version.
const stateMagic = "TINEFSS1"

// Sizes of the fixed parts of a node record (id, parent, nlookup, name
// length) and a handle record (id, node, flags, dir).
const (
	nodeRecord   = 8 + 8 + 8 + 2
	handleRecord = 8 + 8 + 4 + 1
)

// Export returns the server's tables: every node's id, parent id, name and
// lookup count, every open handle's id, node id, open flags and whether it is
// a directory, and the next node id and handle id. Safe to call while serving.
//
// The format is little-endian: the magic "TINEFSS1", the next node id and
// next handle id (u64 each), a node count (u32) and the nodes, parents before
// children (id u64, parent id u64 with 0 for a detached node and 1 for the
// root, nlookup u64, name length u16, name), then a handle count (u32) and
// the handles by id (id u64, node id u64, flags u32, dir u8). The root node
// is implied.
func (s *Server) Export() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := []byte(stateMagic)
	b = binary.LittleEndian.AppendUint64(b, s.nextNode)
	b = binary.LittleEndian.AppendUint64(b, s.nextHandle)

	var order []*node
	walk := func(top *node) { // depth first, children by name, without recursion
		stack := []*node{top}
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if n != top {
				order = append(order, n)
			}
			cs := sortedChildren(n)
			for i := len(cs) - 1; i >= 0; i-- {
				stack = append(stack, cs[i])
			}
		}
	}
	walk(s.nodes[rootID])
	var detached []*node
	for _, n := range s.nodes {
		if n.parent == nil && n.id != rootID {
			detached = append(detached, n)
		}
	}
	sort.Slice(detached, func(i, j int) bool { return detached[i].id < detached[j].id })
	for _, n := range detached {
		order = append(order, n)
		walk(n)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(order)))
	for _, n := range order {
		var parent uint64
		if n.parent != nil {
			parent = n.parent.id
		}
		b = binary.LittleEndian.AppendUint64(b, n.id)
		b = binary.LittleEndian.AppendUint64(b, parent)
		b = binary.LittleEndian.AppendUint64(b, n.nlookup)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(n.name)))
		b = append(b, n.name...)
	}

	fhs := make([]uint64, 0, len(s.handles))
	for fh := range s.handles {
		fhs = append(fhs, fh)
	}
	sort.Slice(fhs, func(i, j int) bool { return fhs[i] < fhs[j] })
	b = binary.LittleEndian.AppendUint32(b, uint32(len(fhs)))
	for _, fh := range fhs {
		h := s.handles[fh]
		b = binary.LittleEndian.AppendUint64(b, h.id)
		b = binary.LittleEndian.AppendUint64(b, h.node)
		b = binary.LittleEndian.AppendUint32(b, h.flags)
		dir := byte(0)
		if h.dir {
			dir = 1
		}
		b = append(b, dir)
	}
	if len(b) > MaxState {
		return nil, fmt.Errorf("fuseserver: state of %d bytes exceeds %d", len(b), MaxState)
	}
	return b, nil
}

// Import replaces the tables of a new server (before it serves) with ones
// from Export of a server of another copy of the tree. Nothing is opened now:
// handles are reopened by path at first use; a handle whose file is gone
// answers EIO for its operations, and its Release still succeeds. New ids
// continue after the imported counters and are never reused.
func (s *Server) Import(state []byte) error {
	nodes, handles, nextNode, nextHandle, err := decodeState(state)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.handles) != 0 {
		return errors.New("fuseserver: import into a server with open handles")
	}
	s.nodes, s.handles, s.nextNode, s.nextHandle = nodes, handles, nextNode, nextHandle
	return nil
}

// reader consumes a state, remembering the first shortage.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n > len(r.b) {
		if r.err == nil {
			r.err = errors.New("fuseserver: state truncated")
		}
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

// decodeState parses and checks an exported state.
func decodeState(b []byte) (map[uint64]*node, map[uint64]*handle, uint64, uint64, error) {
	fail := func(format string, args ...any) (map[uint64]*node, map[uint64]*handle, uint64, uint64, error) {
		return nil, nil, 0, 0, fmt.Errorf("fuseserver: state: "+format, args...)
	}
	if len(b) > MaxState {
		return fail("%d bytes exceeds %d", len(b), MaxState)
	}
	r := &reader{b: b}
	if string(r.take(len(stateMagic))) != stateMagic {
		return fail("bad magic")
	}
	nextNode, nextHandle := r.u64(), r.u64()
	if r.err != nil {
		return fail("%v", r.err)
	}
	if nextNode <= rootID || nextHandle == 0 {
		return fail("bad counters %d, %d", nextNode, nextHandle)
	}

	count := r.u32()
	if r.err != nil || uint64(count) > uint64(len(r.b))/(nodeRecord+1) {
		return fail("node count %d does not fit", count)
	}
	root := &node{id: rootID, nlookup: 1}
	nodes := make(map[uint64]*node, count+1)
	nodes[rootID] = root
	for range count {
		id, parent, nlookup := r.u64(), r.u64(), r.u64()
		name := string(r.take(int(r.u16())))
		if r.err != nil {
			return fail("%v", r.err)
		}
		if id <= rootID || id >= nextNode || nodes[id] != nil {
			return fail("bad node id %d", id)
		}
		if !validName(name).Ok() {
			return fail("bad name %q", name)
		}
		n := &node{id: id, name: name, nlookup: nlookup}
		if parent != 0 {
			p := nodes[parent]
			if p == nil {
				return fail("node %d: parent %d not defined before it", id, parent)
			}
			if p.children[name] != nil {
				return fail("node %d: duplicate name %q", id, name)
			}
			attach(n, p, name)
		}
		nodes[id] = n
	}

	count = r.u32()
	if r.err != nil || uint64(count) > uint64(len(r.b))/handleRecord {
		return fail("handle count %d does not fit", count)
	}
	handles := make(map[uint64]*handle, count)
	for range count {
		id, nid, flags := r.u64(), r.u64(), r.u32()
		dir := r.take(1)
		if r.err != nil {
			return fail("%v", r.err)
		}
		if id == 0 || id >= nextHandle || handles[id] != nil {
			return fail("bad handle id %d", id)
		}
		n := nodes[nid]
		if n == nil {
			return fail("handle %d: unknown node %d", id, nid)
		}
		if dir[0] > 1 {
			return fail("handle %d: bad dir flag %d", id, dir[0])
		}
		handles[id] = &handle{id: id, node: nid, flags: flags, dir: dir[0] == 1, fd: -1}
		n.open++
	}
	if len(r.b) != 0 {
		return fail("%d trailing bytes", len(r.b))
	}
	if nodes[rootID].parent != nil {
		return fail("root has a parent")
	}
	return nodes, handles, nextNode, nextHandle, nil
}
