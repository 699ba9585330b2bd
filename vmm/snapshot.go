package vmm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
	"tine/vmm/internal/kvmapi"
)

// Snapshot layout in the chunk store (see docs/vmm.md):
//
//	root node:     links [state blob, top of page tree]
//	               payload "TINEVMM1" | u64 RAM size | u8 tree height
//	page tree:     interior nodes of up to fanout links; leaves below
//	leaf node:     links = ids of its non-zero pages in order,
//	               payload = bitmap of leafPages bits (1 = page stored)
//
// Every page is a 4 KiB chunk; zero pages are never stored.
const (
	snapMagic = "TINEVMM1"
	leafPages = 512
	fanout    = 512
	maxHeight = 8
)

var errSnapFormat = errors.New("bad VM snapshot")

// leafNodeMax bounds the bytes of a leaf node: a link per page and the
// bitmap.
const leafNodeMax = leafPages*uint64(len(chunkstore.ID{})) + leafPages/8

// SnapshotStats describes what a snapshot cost.
type SnapshotStats struct {
	PagesHashed  int           // pages read and hashed
	PagesStored  int           // non-zero pages among them
	LeavesStored int           // leaf nodes rewritten
	Bytes        uint64        // state, page and leaf bytes written, before deduplication
	Duration     time.Duration // from pause to flushed store
	Incremental  bool
}

// snapTracker remembers a VM's last snapshot in one store, so that the
// next one hashes only pages written since.
type snapTracker struct {
	store  *chunkstore.Store
	leaves []chunkstore.ID
}

// MarkDirty records that the host wrote guest RAM at [off, off+n), which
// KVM's dirty log does not see. Only needed with DirtyLog and incremental
// snapshots.
func (vm *VM) MarkDirty(off, n uint64) {
	if vm.dirty == nil || n == 0 || off >= vm.cfg.MemSize {
		return
	}
	end := min(off+n, vm.cfg.MemSize)
	for p := off / PageSize; p < (end+PageSize-1)/PageSize; p++ {
		vm.dirty[p/64] |= 1 << (p % 64)
	}
}

// collectDirty ORs KVM's dirty log (which it clears) into vm.dirty.
func (vm *VM) collectDirty() error {
	if err := kvmapi.GetDirtyLog(vm.vmFd, 0, vm.kvmDirty); err != nil {
		return fmt.Errorf("vmm: %w", err)
	}
	for i, w := range vm.kvmDirty {
		vm.dirty[i] |= w
	}
	return nil
}

// candidatePages marks the pages that may hold data: data extents of the
// VM's memfd or image, and pages present in its own mapping.
func (vm *VM) candidatePages() ([]uint64, error) {
	pages := vm.cfg.MemSize / PageSize
	want := make([]uint64, (pages+63)/64)
	mark := func(off, n int64) error {
		for p := uint64(off) / PageSize; p < uint64(off+n+PageSize-1)/PageSize && p < pages; p++ {
			want[p/64] |= 1 << (p % 64)
		}
		return nil
	}
	switch {
	case vm.uffd != nil:
		for i := range want {
			want[i] = ^uint64(0)
		}
		return want, nil
	case vm.memfd >= 0 && vm.image == nil:
		if err := forEachExtent(vm.memfd, vm.cfg.MemSize, mark); err != nil {
			return nil, fmt.Errorf("vmm: guest RAM memfd: %w", err)
		}
		return want, nil
	case vm.image != nil:
		if err := forEachExtent(vm.image.fd, vm.cfg.MemSize, mark); err != nil {
			return nil, fmt.Errorf("vmm: image: %w", err)
		}
	}
	return want, presentPages(vm.mem, want)
}

// Snapshot stores the VM's machine state and RAM in store and returns the
// snapshot's root id. The VM is paused meanwhile. With Config.DirtyLog,
// every snapshot after the first into the same store hashes only the
// pages written since the previous one.
func (vm *VM) Snapshot(ctx context.Context, store *chunkstore.Store) (chunkstore.ID, SnapshotStats, error) {
	start := time.Now()
	vm.Pause()
	defer vm.Resume()
	var stats SnapshotStats
	if vm.family != nil {
		// What a snapshot writes counts against its family's limit, also
		// when it fails half way.
		defer func() { vm.family.chargeSnapshot(stats.Bytes) }()
	}
	st, err := vm.CaptureState()
	if err != nil {
		return chunkstore.ID{}, stats, err
	}
	stateBytes, err := st.MarshalBinary()
	if err != nil {
		return chunkstore.ID{}, stats, err
	}
	stateID, err := store.Put(stateBytes)
	if err != nil {
		return chunkstore.ID{}, stats, fmt.Errorf("vmm: store machine state: %w", err)
	}
	stats.Bytes += uint64(len(stateBytes))
	pages := vm.cfg.MemSize / PageSize
	nLeaves := int((pages + leafPages - 1) / leafPages)
	var todo []uint64
	incremental := vm.dirty != nil && vm.snap != nil && vm.snap.store == store
	if vm.dirty != nil {
		if err := vm.collectDirty(); err != nil {
			return chunkstore.ID{}, stats, err
		}
	}
	if incremental {
		todo = vm.dirty
	} else {
		todo, err = vm.candidatePages()
		if err != nil {
			return chunkstore.ID{}, stats, err
		}
		vm.snap = &snapTracker{store: store, leaves: make([]chunkstore.ID, nLeaves)}
	}
	stats.Incremental = incremental
	tr := vm.snap
	for l := range nLeaves {
		if err := ctx.Err(); err != nil {
			vm.snap = nil
			return chunkstore.ID{}, stats, err
		}
		first := uint64(l) * leafPages
		n := min(uint64(leafPages), pages-first)
		if !anyBit(todo, first, n) && !(tr.leaves[l] == chunkstore.ID{} && !incremental) {
			continue
		}
		var ids [leafPages]chunkstore.ID
		if incremental {
			if err := loadLeaf(store, tr.leaves[l], &ids); err != nil {
				vm.snap = nil
				return chunkstore.ID{}, stats, err
			}
		}
		for i := range n {
			p := first + i
			if todo[p/64]&(1<<(p%64)) == 0 {
				continue
			}
			stats.PagesHashed++
			id, err := store.Put(vm.mem[p*PageSize : (p+1)*PageSize])
			if err != nil {
				vm.snap = nil
				return chunkstore.ID{}, stats, fmt.Errorf("vmm: store page %d: %w", p, err)
			}
			if id != (chunkstore.ID{}) {
				stats.PagesStored++
				stats.Bytes += PageSize
			}
			ids[i] = id
		}
		leaf, err := putLeaf(store, &ids)
		if err != nil {
			vm.snap = nil
			return chunkstore.ID{}, stats, err
		}
		tr.leaves[l] = leaf
		stats.LeavesStored++
		stats.Bytes += leafNodeMax
	}
	top, height, err := putTree(store, tr.leaves)
	if err != nil {
		vm.snap = nil
		return chunkstore.ID{}, stats, err
	}
	payload := make([]byte, 0, len(snapMagic)+9)
	payload = append(payload, snapMagic...)
	payload = binary.LittleEndian.AppendUint64(payload, vm.cfg.MemSize)
	payload = append(payload, byte(height))
	root, err := store.PutNode([]chunkstore.ID{stateID, top}, payload)
	if err != nil {
		vm.snap = nil
		return chunkstore.ID{}, stats, fmt.Errorf("vmm: store snapshot root: %w", err)
	}
	if err := store.Flush(); err != nil {
		vm.snap = nil
		return chunkstore.ID{}, stats, fmt.Errorf("vmm: flush store: %w", err)
	}
	if vm.dirty != nil {
		clear(vm.dirty)
	}
	stats.Duration = time.Since(start)
	return root, stats, nil
}

func anyBit(b []uint64, first, n uint64) bool {
	for p := first; p < first+n; {
		w := b[p/64]
		if p%64 == 0 && first+n-p >= 64 {
			if w != 0 {
				return true
			}
			p += 64
			continue
		}
		if w&(1<<(p%64)) != 0 {
			return true
		}
		p++
	}
	return false
}

func putLeaf(store *chunkstore.Store, ids *[leafPages]chunkstore.ID) (chunkstore.ID, error) {
	bitmap := make([]byte, leafPages/8)
	var links []chunkstore.ID
	for i, id := range ids {
		if id != (chunkstore.ID{}) {
			bitmap[i/8] |= 1 << (i % 8)
			links = append(links, id)
		}
	}
	id, err := store.PutNode(links, bitmap)
	if err != nil {
		return id, fmt.Errorf("vmm: store page-tree leaf: %w", err)
	}
	return id, nil
}

// decodeLeaf checks a leaf node and spreads its page ids over ids.
func decodeLeaf(name string, links []chunkstore.ID, payload []byte, ids *[leafPages]chunkstore.ID) error {
	if len(payload) != leafPages/8 {
		return fmt.Errorf("vmm: leaf %s: payload of %d bytes, want %d: %w", name, len(payload), leafPages/8, errSnapFormat)
	}
	n := 0
	for _, b := range payload {
		n += bits.OnesCount8(b)
	}
	if n != len(links) {
		return fmt.Errorf("vmm: leaf %s: %d pages marked, %d links: %w", name, n, len(links), errSnapFormat)
	}
	k := 0
	for i := range ids {
		if payload[i/8]&(1<<(i%8)) != 0 {
			if links[k] == (chunkstore.ID{}) {
				return fmt.Errorf("vmm: leaf %s: link %d is the zero id: %w", name, k, errSnapFormat)
			}
			ids[i] = links[k]
			k++
		} else {
			ids[i] = chunkstore.ID{}
		}
	}
	return nil
}

func loadLeaf(store *chunkstore.Store, id chunkstore.ID, ids *[leafPages]chunkstore.ID) error {
	links, payload, err := store.GetNode(id)
	if err != nil {
		return fmt.Errorf("vmm: load page-tree leaf %s: %w", id, err)
	}
	return decodeLeaf(id.String(), links, payload, ids)
}

// putTree stores interior nodes over the leaves and returns the top id and
// the tree height (0 = the top is the only leaf).
func putTree(store *chunkstore.Store, level []chunkstore.ID) (chunkstore.ID, int, error) {
	height := 0
	for len(level) > 1 || height == 0 && len(level) == 0 {
		var next []chunkstore.ID
		for i := 0; i < len(level) || i == 0; i += fanout {
			end := min(i+fanout, len(level))
			id, err := store.PutNode(level[i:end], nil)
			if err != nil {
				return id, 0, fmt.Errorf("vmm: store page-tree node: %w", err)
			}
			next = append(next, id)
		}
		level = next
		height++
	}
	return level[0], height, nil
}

// snapshotReader resolves the pages of a stored snapshot.
type snapshotReader struct {
	store   *chunkstore.Store
	name    string
	memSize uint64
	leaves  []chunkstore.ID
}

// openSnapshot reads a snapshot's root and page tree (not the pages).
func openSnapshot(store *chunkstore.Store, root chunkstore.ID) (*State, *snapshotReader, error) {
	name := "snapshot " + root.String()
	links, payload, err := store.GetNode(root)
	if err != nil {
		return nil, nil, fmt.Errorf("vmm: %s: %w", name, err)
	}
	memSize, height, err := decodeRoot(name, links, payload)
	if err != nil {
		return nil, nil, err
	}
	stateBytes, err := store.Get(links[0])
	if err != nil {
		return nil, nil, fmt.Errorf("vmm: %s: machine state: %w", name, err)
	}
	st, err := UnmarshalState(name, stateBytes)
	if err != nil {
		return nil, nil, err
	}
	if st.MemSize != memSize {
		return nil, nil, fmt.Errorf("vmm: %s: state for %d bytes of RAM, root says %d: %w", name, st.MemSize, memSize, errSnapFormat)
	}
	nLeaves := int((memSize/PageSize + leafPages - 1) / leafPages)
	level := []chunkstore.ID{links[1]}
	for h := height; h > 0; h-- {
		var next []chunkstore.ID
		for _, id := range level {
			l, p, err := store.GetNode(id)
			if err != nil {
				return nil, nil, fmt.Errorf("vmm: %s: page tree: %w", name, err)
			}
			if len(p) != 0 || len(l) > fanout {
				return nil, nil, fmt.Errorf("vmm: %s: page-tree node %s: %w", name, id, errSnapFormat)
			}
			next = append(next, l...)
			if len(next) > nLeaves {
				return nil, nil, fmt.Errorf("vmm: %s: page tree has more than %d leaves: %w", name, nLeaves, errSnapFormat)
			}
		}
		level = next
	}
	if len(level) != nLeaves {
		return nil, nil, fmt.Errorf("vmm: %s: page tree has %d leaves, want %d: %w", name, len(level), nLeaves, errSnapFormat)
	}
	return st, &snapshotReader{store: store, name: name, memSize: memSize, leaves: level}, nil
}

// decodeRoot checks a snapshot root node.
func decodeRoot(name string, links []chunkstore.ID, payload []byte) (memSize uint64, height int, err error) {
	if len(links) != 2 || len(payload) != len(snapMagic)+9 || string(payload[:len(snapMagic)]) != snapMagic {
		return 0, 0, fmt.Errorf("vmm: %s: root node offset 0: not a VM snapshot: %w", name, errSnapFormat)
	}
	memSize = binary.LittleEndian.Uint64(payload[len(snapMagic):])
	height = int(payload[len(snapMagic)+8])
	if memSize == 0 || memSize%PageSize != 0 || memSize > 1<<46 {
		return 0, 0, fmt.Errorf("vmm: %s: root node offset %d: RAM size %d: %w", name, len(snapMagic), memSize, errSnapFormat)
	}
	if height > maxHeight {
		return 0, 0, fmt.Errorf("vmm: %s: root node offset %d: tree height %d: %w", name, len(snapMagic)+8, height, errSnapFormat)
	}
	return memSize, height, nil
}

// forEachPage calls fn for every stored (non-zero) page in order.
func (r *snapshotReader) forEachPage(ctx context.Context, fn func(page uint64, data []byte) error) error {
	var ids [leafPages]chunkstore.ID
	for l, leaf := range r.leaves {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := loadLeaf(r.store, leaf, &ids); err != nil {
			return err
		}
		for i, id := range ids {
			if id == (chunkstore.ID{}) {
				continue
			}
			p := uint64(l)*leafPages + uint64(i)
			if p >= r.memSize/PageSize {
				return fmt.Errorf("vmm: %s: page %d beyond RAM: %w", r.name, p, errSnapFormat)
			}
			data, err := r.store.Get(id)
			if err != nil {
				return fmt.Errorf("vmm: %s: page %d: %w", r.name, p, err)
			}
			if len(data) != PageSize {
				return fmt.Errorf("vmm: %s: page %d is %d bytes: %w", r.name, p, len(data), errSnapFormat)
			}
			if err := fn(p, data); err != nil {
				return err
			}
		}
	}
	return nil
}

// ReadPage serves a page from the chunk store (userfaultfd fork mode).
func (r *snapshotReader) ReadPage(off uint64, buf []byte) (bool, error) {
	p := off / PageSize
	l := p / leafPages
	if l >= uint64(len(r.leaves)) {
		return true, nil
	}
	var ids [leafPages]chunkstore.ID
	if err := loadLeaf(r.store, r.leaves[l], &ids); err != nil {
		return false, err
	}
	id := ids[p%leafPages]
	if id == (chunkstore.ID{}) {
		return true, nil
	}
	data, err := r.store.Get(id)
	if err != nil {
		return false, fmt.Errorf("vmm: %s: page %d: %w", r.name, p, err)
	}
	if len(data) != PageSize {
		return false, fmt.Errorf("vmm: %s: page %d is %d bytes: %w", r.name, p, len(data), errSnapFormat)
	}
	copy(buf, data)
	return false, nil
}

// LoadSnapshot rebuilds a stored snapshot as a sealed image (a sparse
// memfd with the snapshot's pages) from which VMs are forked or restored,
// in this or any process.
func LoadSnapshot(ctx context.Context, store *chunkstore.Store, root chunkstore.ID, cfg Config) (*Image, error) {
	st, r, err := openSnapshot(store, root)
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("tine-vm-image", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("vmm: memfd for %s: %w", r.name, err)
	}
	if err := unix.Ftruncate(fd, int64(st.MemSize)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vmm: size memfd for %s: %w", r.name, err)
	}
	err = r.forEachPage(ctx, func(p uint64, data []byte) error {
		if _, err := unix.Pwrite(fd, data, int64(p*PageSize)); err != nil {
			return fmt.Errorf("vmm: write page %d of %s: %w", p, r.name, err)
		}
		return nil
	})
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return newImage(fd, st, cfg, nil, nil, 0), nil
}

// OpenSnapshotLazy makes an image of a stored snapshot without copying
// any page: it can only fork ForkUserfault children, whose pages are read
// from the store on first touch.
func OpenSnapshotLazy(store *chunkstore.Store, root chunkstore.ID, cfg Config) (*Image, error) {
	st, r, err := openSnapshot(store, root)
	if err != nil {
		return nil, err
	}
	return newImage(-1, st, cfg, r, nil, 0), nil
}
