package cowfs

import (
	"container/list"
	"sync"

	"tine/chunkstore"
)

// dirCacheBytes bounds the decoded directory objects an FS keeps.
const dirCacheBytes = 32 << 20

// dirCache keeps decoded directory objects by content address, least
// recently used first out. A directory object never changes (its id is
// its content's hash), so an entry is never stale. Entries handed out are
// copies: no caller can change what the cache holds.
type dirCache struct {
	mu    sync.Mutex
	max   int64
	used  int64
	lru   list.List // of *dirCacheItem, most recently used at the front
	items map[chunkstore.ID]*list.Element
	hits  int64 // lookups answered from the cache (for tests)
}

type dirCacheItem struct {
	id      chunkstore.ID
	es      []Entry
	cost    int64
	subdirs uint32 // entries that are directories
}

// entriesCost is about what es holds in memory.
func entriesCost(es []Entry) int64 {
	n := int64(64)
	for i := range es {
		e := &es[i]
		n += 160 + int64(len(e.Name)+len(e.Target))
		for _, x := range e.Xattrs {
			n += 48 + int64(len(x.Name)+len(x.Value))
		}
	}
	return n
}

// copyEntries copies es deeply (names and targets are immutable strings).
func copyEntries(es []Entry) []Entry {
	out := make([]Entry, len(es))
	copy(out, es)
	for i := range out {
		if xs := out[i].Xattrs; len(xs) > 0 {
			out[i].Xattrs = make([]Xattr, len(xs))
			for j, x := range xs {
				out[i].Xattrs[j] = Xattr{Name: x.Name, Value: append([]byte(nil), x.Value...)}
			}
		}
	}
	return out
}

// get returns a copy of the cached entries of id.
func (c *dirCache) get(id chunkstore.ID) ([]Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[id]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(el)
	c.hits++
	return copyEntries(el.Value.(*dirCacheItem).es), true
}

// subdirs returns how many of the cached entries of id are directories.
func (c *dirCache) subdirs(id chunkstore.ID) (uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[id]
	if !ok {
		return 0, false
	}
	c.lru.MoveToFront(el)
	c.hits++
	return el.Value.(*dirCacheItem).subdirs, true
}

// put keeps a copy of es as id's entries.
func (c *dirCache) put(id chunkstore.ID, es []Entry) {
	cost := entriesCost(es)
	c.mu.Lock()
	defer c.mu.Unlock()
	if cost > c.max/4 {
		return // one huge directory would push out everything else
	}
	if c.items == nil {
		c.items = map[chunkstore.ID]*list.Element{}
	}
	if _, ok := c.items[id]; ok {
		return
	}
	c.items[id] = c.lru.PushFront(&dirCacheItem{id: id, es: copyEntries(es), cost: cost, subdirs: countSubdirs(es)})
	c.used += cost
	for c.used > c.max {
		el := c.lru.Back()
		it := el.Value.(*dirCacheItem)
		c.lru.Remove(el)
		delete(c.items, it.id)
		c.used -= it.cost
	}
}

// countSubdirs returns how many of es are directories.
func countSubdirs(es []Entry) uint32 {
	var n uint32
	for i := range es {
		if es[i].Type == TypeDir {
			n++
		}
	}
	return n
}

// dirSubdirs returns how many entries of directory object id are
// directories, from the cache (decoding the object into it first when
// needed), without copying the entries. ok is false when the object
// cannot be read or is too big to be cached: the caller loads it then,
// once, rather than decoding it again at every call.
func (f *FS) dirSubdirs(id chunkstore.ID) (n uint32, ok bool) {
	if n, ok := f.dirs.subdirs(id); ok {
		return n, true
	}
	if _, err := f.getDir(id); err != nil {
		return 0, false
	}
	return f.dirs.subdirs(id)
}

// getDir reads a directory object through the FS's cache of decoded
// directories.
func (f *FS) getDir(id chunkstore.ID) ([]Entry, error) {
	if es, ok := f.dirs.get(id); ok {
		return es, nil
	}
	es, err := getDir(f.store, id)
	if err != nil {
		return nil, err
	}
	f.dirs.put(id, es)
	return es, nil
}
