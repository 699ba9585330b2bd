// Package disk is the copy-on-write block image behind a VM's virtio
// block device. An image is a sequence of 64 KiB chunks held in the chunk
// store; a VM's writes stay in its own overlay until the image is sealed
// (for a fork or a snapshot), when they are stored and the image becomes
// an immutable base that every child shares. A fork's disk therefore
// forks at the same instant as its memory, for the cost of storing the
// chunks written since the last seal.
package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"sync"

	"tine/chunkstore"
)

// ChunkSize is the image's unit of copy-on-write and of storage.
const ChunkSize = 64 << 10

// leafChunks is how many chunks one snapshot leaf node covers.
const leafChunks = 1024

const rootMagic = "TINEDSK1"

// Image is one VM's view of a disk: an immutable base (chunk ids shared
// with its parent and siblings) under a private overlay of written
// chunks. Its methods are safe for concurrent use.
type Image struct {
	mu    sync.RWMutex
	store *chunkstore.Store
	size  int64
	base  map[uint64]chunkstore.ID // shared: never written once an image holds it
	dirty map[uint64][]byte
	// MaxDirty bounds the overlay kept in host memory; past it the
	// overlay is stored (into the chunk store) and stays private.
	maxDirty int
	own      map[uint64]chunkstore.ID // stored but private chunks
	closed   bool
}

// DefaultMaxDirty is how many written chunks an image keeps in memory
// before storing them (64 MiB).
const DefaultMaxDirty = 1024

// New returns an empty (all-zero) image of size bytes, a multiple of 512.
func New(store *chunkstore.Store, size int64) (*Image, error) {
	if size <= 0 || size%512 != 0 {
		return nil, fmt.Errorf("disk: image size %d is not a positive multiple of 512", size)
	}
	return &Image{store: store, size: size, base: map[uint64]chunkstore.ID{}, dirty: map[uint64][]byte{},
		own: map[uint64]chunkstore.ID{}, maxDirty: DefaultMaxDirty}, nil
}

// Size implements virtio.Disk.
func (im *Image) Size() int64 { return im.size }

// Flush implements virtio.Disk: the overlay lives until a seal, so there
// is nothing to do; a crash of the host loses the VM anyway.
func (im *Image) Flush() error { return nil }

func (im *Image) check(n int, off int64) error {
	if off < 0 || int64(n) > im.size || off > im.size-int64(n) {
		return fmt.Errorf("disk: %d bytes at %d outside the image of %d bytes", n, off, im.size)
	}
	return nil
}

// chunk returns chunk i's bytes for reading (nil for zeros); the lock is
// held.
func (im *Image) chunk(i uint64) ([]byte, error) {
	if b, ok := im.dirty[i]; ok {
		return b, nil
	}
	id, ok := im.own[i]
	if !ok {
		id, ok = im.base[i]
	}
	if !ok || id.IsZero() {
		return nil, nil
	}
	b, err := im.store.Get(id)
	if err != nil {
		return nil, fmt.Errorf("disk: chunk %d (%s): %w", i, id, err)
	}
	if len(b) != ChunkSize {
		return nil, fmt.Errorf("disk: chunk %d (%s) has %d bytes, want %d", i, id, len(b), ChunkSize)
	}
	return b, nil
}

// ReadAt implements io.ReaderAt.
func (im *Image) ReadAt(p []byte, off int64) (int, error) {
	if err := im.check(len(p), off); err != nil {
		return 0, err
	}
	im.mu.RLock()
	defer im.mu.RUnlock()
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		i, in := uint64(pos/ChunkSize), int(pos%ChunkSize)
		b, err := im.chunk(i)
		if err != nil {
			return done, err
		}
		n := min(len(p)-done, ChunkSize-in)
		if b == nil {
			clear(p[done : done+n])
		} else {
			copy(p[done:done+n], b[in:])
		}
		done += n
	}
	return done, nil
}

// WriteAt implements io.WriterAt.
func (im *Image) WriteAt(p []byte, off int64) (int, error) {
	if err := im.check(len(p), off); err != nil {
		return 0, err
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.closed {
		return 0, errors.New("disk: image closed")
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		i, in := uint64(pos/ChunkSize), int(pos%ChunkSize)
		b, ok := im.dirty[i]
		if !ok {
			old, err := im.chunk(i)
			if err != nil {
				return done, err
			}
			b = make([]byte, ChunkSize)
			copy(b, old)
			if len(im.dirty) >= im.maxDirty {
				if err := im.spill(); err != nil {
					return done, err
				}
			}
			im.dirty[i] = b
		}
		n := min(len(p)-done, ChunkSize-in)
		copy(b[in:], p[done:done+n])
		done += n
	}
	return done, nil
}

// spill stores the overlay's chunks; they stay private to this image.
func (im *Image) spill() error {
	for i, b := range im.dirty {
		id, err := im.store.Put(b)
		if err != nil {
			return fmt.Errorf("disk: store chunk %d: %w", i, err)
		}
		im.own[i] = id
		delete(im.dirty, i)
	}
	return nil
}

// seal stores the overlay and makes base the image's whole content; the
// lock is held. The returned map is immutable from now on.
func (im *Image) seal() (map[uint64]chunkstore.ID, error) {
	if err := im.spill(); err != nil {
		return nil, err
	}
	if len(im.own) > 0 {
		nb := maps.Clone(im.base)
		maps.Copy(nb, im.own)
		im.base = nb
		im.own = map[uint64]chunkstore.ID{}
	}
	return im.base, nil
}

// Fork seals the image and returns n children that share its content;
// the image itself goes on as one more child. Call it with the VM
// paused, in the same pause as the memory seal.
func (im *Image) Fork(n int) ([]*Image, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	base, err := im.seal()
	if err != nil {
		return nil, err
	}
	kids := make([]*Image, n)
	for k := range kids {
		kids[k] = &Image{store: im.store, size: im.size, base: base, dirty: map[uint64][]byte{},
			own: map[uint64]chunkstore.ID{}, maxDirty: im.maxDirty}
	}
	return kids, nil
}

// Snapshot seals the image and stores it as a tree of nodes; the root's
// id opens it again (Open).
func (im *Image) Snapshot() (chunkstore.ID, error) {
	im.mu.Lock()
	base, err := im.seal()
	im.mu.Unlock()
	if err != nil {
		return chunkstore.ID{}, err
	}
	chunks := (uint64(im.size) + ChunkSize - 1) / ChunkSize
	var leaves []chunkstore.ID
	for l := uint64(0); l*leafChunks < chunks; l++ {
		bitmap := make([]byte, leafChunks/8)
		var links []chunkstore.ID
		for j := uint64(0); j < leafChunks; j++ {
			if id, ok := base[l*leafChunks+j]; ok && !id.IsZero() {
				bitmap[j/8] |= 1 << (j % 8)
				links = append(links, id)
			}
		}
		id, err := im.store.PutNode(links, bitmap)
		if err != nil {
			return chunkstore.ID{}, fmt.Errorf("disk: store leaf %d: %w", l, err)
		}
		leaves = append(leaves, id)
	}
	payload := binary.LittleEndian.AppendUint64([]byte(rootMagic), uint64(im.size))
	root, err := im.store.PutNode(leaves, payload)
	if err != nil {
		return chunkstore.ID{}, fmt.Errorf("disk: store root: %w", err)
	}
	return root, nil
}

// Open returns an image whose base is the snapshot root. The stored
// nodes are checked: a size, a leaf count or a bitmap that disagrees with
// its links is an error naming the node.
func Open(store *chunkstore.Store, root chunkstore.ID) (*Image, error) {
	links, payload, err := store.GetNode(root)
	if err != nil {
		return nil, fmt.Errorf("disk: snapshot root %s: %w", root, err)
	}
	if len(payload) != len(rootMagic)+8 || string(payload[:len(rootMagic)]) != rootMagic {
		return nil, fmt.Errorf("disk: snapshot root %s is not a disk image", root)
	}
	size := int64(binary.LittleEndian.Uint64(payload[len(rootMagic):]))
	im, err := New(store, size)
	if err != nil {
		return nil, fmt.Errorf("disk: snapshot root %s: %w", root, err)
	}
	chunks := (uint64(size) + ChunkSize - 1) / ChunkSize
	if want := (chunks + leafChunks - 1) / leafChunks; uint64(len(links)) != want {
		return nil, fmt.Errorf("disk: snapshot root %s has %d leaves, a %d-byte image needs %d", root, len(links), size, want)
	}
	for l, leaf := range links {
		ids, bitmap, err := store.GetNode(leaf)
		if err != nil {
			return nil, fmt.Errorf("disk: snapshot leaf %d (%s): %w", l, leaf, err)
		}
		if len(bitmap) != leafChunks/8 {
			return nil, fmt.Errorf("disk: snapshot leaf %d (%s): bitmap of %d bytes", l, leaf, len(bitmap))
		}
		k := 0
		for j := uint64(0); j < leafChunks; j++ {
			if bitmap[j/8]&(1<<(j%8)) == 0 {
				continue
			}
			i := uint64(l)*leafChunks + j
			if k >= len(ids) || i >= chunks {
				return nil, fmt.Errorf("disk: snapshot leaf %d (%s): bitmap and links disagree", l, leaf)
			}
			im.base[i] = ids[k]
			k++
		}
		if k != len(ids) {
			return nil, fmt.Errorf("disk: snapshot leaf %d (%s): %d links, bitmap names %d", l, leaf, len(ids), k)
		}
	}
	return im, nil
}

// Close drops the overlay.
func (im *Image) Close() error {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.closed = true
	im.dirty = nil
	return nil
}
