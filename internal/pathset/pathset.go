// Package pathset holds a set of slash-separated paths and answers which
// of them lie above a path in time linear in that path's length. Checking
// every ancestor of a path against a map instead costs the square of the
// path's depth, and a sandbox chooses the depth of what it writes.
package pathset

import "strings"

// Set is a set of slash-separated relative paths ("" is the top). The zero
// Set is empty and ready to use.
type Set struct {
	root node
}

type node struct {
	kids map[string]*node
	in   bool
}

// Add puts p in the set.
func (s *Set) Add(p string) {
	n := &s.root
	forNames(p, func(name string, _ int) bool {
		k := n.kids[name]
		if k == nil {
			if n.kids == nil {
				n.kids = map[string]*node{}
			}
			k = &node{}
			n.kids[name] = k
		}
		n = k
		return true
	})
	n.in = true
}

// Empty reports whether nothing was added.
func (s *Set) Empty() bool {
	return !s.root.in && len(s.root.kids) == 0
}

// Has reports whether p is in the set.
func (s *Set) Has(p string) bool {
	n := s.find(p)
	return n != nil && n.in
}

// HasBelow reports whether a path below p is in the set.
func (s *Set) HasBelow(p string) bool {
	n := s.find(p)
	return n != nil && len(n.kids) > 0
}

// Above calls fn with each path in the set that is a directory above p
// (p itself left out), from the top down, until fn returns false.
func (s *Set) Above(p string, fn func(a string) bool) {
	n := &s.root
	if p == "" {
		return
	}
	if n.in && !fn("") {
		return
	}
	forNames(p, func(name string, end int) bool {
		if end == len(p) {
			return false
		}
		if n = n.kids[name]; n == nil {
			return false
		}
		return !n.in || fn(p[:end])
	})
}

// HasAbove reports whether a directory above p is in the set.
func (s *Set) HasAbove(p string) bool {
	found := false
	s.Above(p, func(string) bool { found = true; return false })
	return found
}

// Within reports whether p or a directory above it is in the set.
func (s *Set) Within(p string) bool {
	return s.Has(p) || s.HasAbove(p)
}

// find is the node of p, or nil when no path at or below p was added.
func (s *Set) find(p string) *node {
	n := &s.root
	forNames(p, func(name string, _ int) bool {
		n = n.kids[name]
		return n != nil
	})
	return n
}

// forNames calls fn with each name of p in turn and the offset where it
// ends, until fn returns false. The top, "", has no names.
func forNames(p string, fn func(name string, end int) bool) {
	for start := 0; p != "" && start <= len(p); {
		end := strings.IndexByte(p[start:], '/')
		if end < 0 {
			end = len(p)
		} else {
			end += start
		}
		if !fn(p[start:end], end) {
			return
		}
		start = end + 1
	}
}
