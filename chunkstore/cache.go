package chunkstore

import (
	"container/list"
	"sync"
)

// chunkCache keeps recently read chunks, decompressed, up to a byte budget.
// Cached slices are shared: callers must not modify what Get returns.
type chunkCache struct {
	mu    sync.Mutex
	max   int64
	size  int64
	order *list.List // front = most recent; values are *cacheEntry
	items map[ID]*list.Element
}

type cacheEntry struct {
	id   ID
	data []byte
}

func newChunkCache(max int64) *chunkCache {
	return &chunkCache{max: max, order: list.New(), items: map[ID]*list.Element{}}
}

func (c *chunkCache) get(id ID) ([]byte, bool) {
	if c.max <= 0 {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[id]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*cacheEntry).data, true
}

func (c *chunkCache) put(id ID, data []byte) {
	if c.max <= 0 || int64(len(data)) > c.max/4 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[id]; ok {
		return
	}
	c.items[id] = c.order.PushFront(&cacheEntry{id: id, data: data})
	c.size += int64(len(data))
	for c.size > c.max {
		e := c.order.Back()
		ce := e.Value.(*cacheEntry)
		c.order.Remove(e)
		delete(c.items, ce.id)
		c.size -= int64(len(ce.data))
	}
}

func (c *chunkCache) drop(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[id]; ok {
		c.size -= int64(len(e.Value.(*cacheEntry).data))
		c.order.Remove(e)
		delete(c.items, id)
	}
}
