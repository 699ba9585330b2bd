package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"tine/chunkstore"
)

// SnapshotID names an immutable snapshot: the id of its root object.
type SnapshotID = chunkstore.ID

// Errors callers may test for with errors.Is.
var (
	// ErrExists reports that a branch or snapshot name is already taken.
	ErrExists = errors.New("already exists")
	// ErrNoBranch reports an unknown branch.
	ErrNoBranch = errors.New("no such branch")
	// ErrNoSnapshot reports an unknown snapshot id or name.
	ErrNoSnapshot = errors.New("no such snapshot")
	// ErrBusy reports that a branch is mounted (by this or another process).
	ErrBusy = errors.New("branch is mounted")
	// ErrBadName reports a branch or snapshot name outside [A-Za-z0-9._-].
	ErrBadName = errors.New("bad name")
)

const (
	refSnap   = "cowfs/snap/"   // + id hex: keeps a snapshot alive
	refName   = "cowfs/name/"   // + name: a named snapshot
	refBranch = "cowfs/branch/" // + branch: the branch's committed head
	refBase   = "cowfs/base/"   // + branch: the snapshot the branch last started from
	refMeta   = "cowfs/meta/"   // + branch: the object holding the branch's settings (meta.go)
)

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`) })

func checkName(kind, n string) error {
	if !nameRE().MatchString(n) {
		return fmt.Errorf("%w: %s name %q (want 1-100 of [A-Za-z0-9._-], not starting with . - _)", ErrBadName, kind, n)
	}
	return nil
}

// Options tunes Open.
type Options struct {
	// Store is passed to chunkstore.Open; nil means defaults.
	Store *chunkstore.Options
	// CacheBytes bounds the passthrough read cache (root/cache); zero
	// means DefaultCacheBytes. Files larger than it are read through
	// FUSE instead.
	CacheBytes int64
	// MemBytes bounds the bytes of small written files kept in memory
	// until a commit, over all branches (see memFileMax); zero means
	// DefaultMemBytes, negative keeps none in memory.
	MemBytes int64
	// BranchMemBytes bounds the same per branch; zero means
	// DefaultBranchMemBytes, negative keeps none in memory.
	BranchMemBytes int64
	// NoImportWatch makes every Import walk its tree, even one that did
	// not change since its last import (see the import watch).
	NoImportWatch bool
	// HeldBytes bounds the server memory that the names, inodes and
	// xattrs made through all mounts may take (held.go); zero means a
	// third of the host's memory, negative no bound. BranchHeldBytes bounds the
	// same per mounted branch; zero means a quarter of the host's memory.
	HeldBytes, BranchHeldBytes int64
}

// FS is tine's copy-on-write filesystem state under one root directory:
// the chunk store (root/store), branch state (root/branches) and the
// shared read cache for passthrough (root/cache). It is safe for
// concurrent use. One process at a time may hold an FS open on a root.
type FS struct {
	root  string
	tag   string // names the root in its mounts' source (see rootTag)
	store *chunkstore.Store

	mu   sync.Mutex
	live map[string]*branch // mounted branches, by name

	backings backingSet // passthrough backing files registered with the mounts

	matMu      sync.Mutex // serialises cache materialisation and eviction
	cacheBytes int64      // the cache's budget
	cacheUsed  int64      // bytes in the cache, under matMu

	memBytes, branchMemBytes int64        // budgets of in-memory file bytes
	memUsed                  atomic.Int64 // in-memory file bytes of every branch

	heldBytes, branchHeldBytes int64        // budgets of held bytes (held.go)
	heldUsed                   atomic.Int64 // held bytes of every mounted branch

	dirs dirCache // decoded directory objects

	watch *importWatcher // nil with Options.NoImportWatch

	viewMu  sync.Mutex
	view    *os.File // read-only view of the cache (see cacheView)
	viewErr error
}

// Open opens (creating if needed) the state root dir.
func Open(root string, opts *Options) (*FS, error) {
	if opts == nil {
		opts = &Options{}
	}
	for _, d := range []string{"", "store", "branches", "cache"} {
		if err := checkStateDir(filepath.Join(root, d)); err != nil {
			return nil, err
		}
	}
	st, err := chunkstore.Open(filepath.Join(root, "store"), opts.Store)
	if errors.Is(err, chunkstore.ErrLocked) {
		return nil, fmt.Errorf("cowfs: open %s: state root in use by %s: %w", root, lockHolder(filepath.Join(root, "store", "lock")), err)
	}
	if err != nil {
		return nil, fmt.Errorf("cowfs: open store in %s: %w", root, err)
	}
	f := &FS{root: root, tag: rootTag(root), store: st, live: map[string]*branch{}, cacheBytes: opts.CacheBytes}
	if f.cacheBytes == 0 {
		f.cacheBytes = DefaultCacheBytes
	}
	f.dirs.max = dirCacheBytes
	f.memBytes = budget(opts.MemBytes, DefaultMemBytes)
	f.branchMemBytes = budget(opts.BranchMemBytes, DefaultBranchMemBytes)
	f.heldBytes, f.branchHeldBytes = heldBudgets(opts.HeldBytes, opts.BranchHeldBytes)
	_, err = f.CleanStaleMounts()
	if err == nil {
		err = f.trimCache()
	}
	if err == nil {
		f.foldLogs()
	}
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("cowfs: open %s: %w", root, err)
	}
	if !opts.NoImportWatch {
		f.watch = newImportWatcher()
	}
	return f, nil
}

// Store returns the chunk store the filesystem keeps its objects in.
func (f *FS) Store() *chunkstore.Store { return f.store }

// Root returns the state root directory.
func (f *FS) Root() string { return f.root }

// Close unmounts nothing: callers unmount their mounts first. It flushes
// and closes the store.
func (f *FS) Close() error {
	f.mu.Lock()
	n := len(f.live)
	f.mu.Unlock()
	if n > 0 {
		return fmt.Errorf("cowfs: close %s: %d branches still mounted", f.root, n)
	}
	f.closeView()
	f.watch.close()
	if err := f.store.Flush(); err != nil {
		f.store.Close()
		return fmt.Errorf("cowfs: flush store in %s: %w", f.root, err)
	}
	return f.store.Close()
}

// setRef points name at id, whatever it pointed at before.
func (f *FS) setRef(name string, id chunkstore.ID) error {
	for try := 0; ; try++ {
		old, err := f.store.GetRef(name)
		if err != nil && !errors.Is(err, chunkstore.ErrNotFound) {
			return fmt.Errorf("read ref %s: %w", name, err)
		}
		if old == id && err == nil {
			return nil
		}
		err = f.store.SetRef(name, old, id)
		if err == nil {
			return nil
		}
		if !errors.Is(err, chunkstore.ErrConflict) || try > 5 {
			return fmt.Errorf("set ref %s: %w", name, err)
		}
	}
}

func (f *FS) getRef(name string) (chunkstore.ID, bool, error) {
	id, err := f.store.GetRef(name)
	if errors.Is(err, chunkstore.ErrNotFound) {
		return id, false, nil
	}
	if err != nil {
		return id, false, fmt.Errorf("read ref %s: %w", name, err)
	}
	return id, true, nil
}

// keepSnapshot makes id a durable, named-by-id snapshot (SetRef makes
// the objects durable first).
func (f *FS) keepSnapshot(id SnapshotID) error {
	return f.setRef(refSnap+id.String(), id)
}

// NameSnapshot gives snapshot id the name n (replacing an older snapshot of
// that name).
func (f *FS) NameSnapshot(ctx context.Context, id SnapshotID, n string) error {
	if err := checkName("snapshot", n); err != nil {
		return err
	}
	if _, ok, err := f.getRef(refSnap + id.String()); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("name snapshot %s: %w", id, ErrNoSnapshot)
	}
	return f.setRef(refName+n, id) // durable when it returns
}

// Resolve turns a snapshot id (hex), a snapshot name or a branch name into
// a snapshot id. A branch resolves to its current state: a mounted branch
// is committed first (see Head).
func (f *FS) Resolve(ctx context.Context, spec string) (SnapshotID, error) {
	if id, err := chunkstore.ParseID(spec); err == nil {
		if _, ok, err := f.getRef(refSnap + id.String()); err != nil {
			return id, err
		} else if ok {
			return id, nil
		}
	}
	if nameRE().MatchString(spec) {
		if id, ok, err := f.getRef(refName + spec); err != nil {
			return id, err
		} else if ok {
			return id, nil
		}
		if _, ok, err := f.getRef(refBranch + spec); err != nil {
			return SnapshotID{}, err
		} else if ok {
			return f.Head(ctx, spec)
		}
	}
	return SnapshotID{}, fmt.Errorf("resolve %q: %w (not a snapshot id, snapshot name or branch)", spec, ErrNoSnapshot)
}

// Head returns the id of the branch's current state without making it a
// snapshot. For a mounted branch this commits its changes (cost: what
// changed since the last commit). The id stays in the store while the
// branch head points at it; take a Snapshot to keep it for good.
func (f *FS) Head(ctx context.Context, branchName string) (SnapshotID, error) {
	if b := f.liveBranch(branchName); b != nil {
		if err := b.flushMapped(); err != nil {
			return SnapshotID{}, err
		}
		return b.checkpoint(ctx, false)
	}
	if _, ok, err := f.getRef(refPending + branchName); err != nil {
		return SnapshotID{}, err
	} else if ok {
		// Bytes an fsync left in overlay files belong to the head.
		b, err := f.openBranch(branchName)
		if err != nil {
			return SnapshotID{}, err
		}
		b.close()
	}
	id, ok, err := f.getRef(refBranch + branchName)
	if err != nil {
		return id, err
	}
	if !ok {
		return id, fmt.Errorf("head of %q: %w", branchName, ErrNoBranch)
	}
	return id, nil
}

// liveBranch returns the mounted branch of that name, or nil (also while
// a mount of it is still being set up).
func (f *FS) liveBranch(name string) *branch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[name]
}

// mounted reports whether the branch is mounted or being mounted here.
func (f *FS) mounted(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.live[name]
	return ok
}

// Snapshot records the branch's current state as a snapshot and returns
// its id. It walks nothing and copies no data: for a mounted branch it
// writes only what changed since the previous commit, writes made
// through shared mappings included (mapped.go).
func (f *FS) Snapshot(ctx context.Context, branchName string) (SnapshotID, error) {
	if b := f.liveBranch(branchName); b != nil {
		if err := b.flushMapped(); err != nil {
			return SnapshotID{}, err
		}
		id, err := b.snapshot(ctx)
		if err != nil {
			return id, fmt.Errorf("snapshot %q: %w", branchName, err)
		}
		return id, nil
	}
	id, err := f.Head(ctx, branchName)
	if err != nil {
		return id, err
	}
	if err := f.keepSnapshot(id); err != nil {
		return id, fmt.Errorf("snapshot %q: %w", branchName, err)
	}
	return id, nil
}

func (f *FS) branchDir(name string) string { return filepath.Join(f.root, "branches", name) }

// Branch creates branch name as a writable head over snapshot snap. It
// copies nothing: the branch starts as a reference to snap.
func (f *FS) Branch(ctx context.Context, snap SnapshotID, name string) error {
	return f.BranchMany(ctx, snap, []string{name})
}

// BranchMany creates the branches names over snapshot snap, as Branch
// does each, in one durable update (one ref log record, one fdatasync):
// all of them or, on error, none.
func (f *FS) BranchMany(ctx context.Context, snap SnapshotID, names []string) error {
	return f.branchMany(ctx, snap, names, true)
}

// BranchManyDeferred creates the branches as BranchMany does, at once, but
// does not wait for them to be durable: they become durable with the next
// durable update of the store (a commit of any branch, a snapshot, a
// quota set, Flush, Close). A crash before that loses them, and nothing
// else: until its first commit a branch holds only its snapshot, which
// stays. For callers that can make a lost branch again (ADR 0190).
func (f *FS) BranchManyDeferred(ctx context.Context, snap SnapshotID, names []string) error {
	return f.branchMany(ctx, snap, names, false)
}

func (f *FS) branchMany(ctx context.Context, snap SnapshotID, names []string, durable bool) error {
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		if err := checkName("branch", name); err != nil {
			return err
		}
		if seen[name] {
			return fmt.Errorf("branch %q: named twice", name)
		}
		seen[name] = true
	}
	if _, ok, err := f.getRef(refSnap + snap.String()); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("branch %q from %s: %w", names[0], snap, ErrNoSnapshot)
	}
	for _, name := range names {
		if _, ok, err := f.getRef(refBranch + name); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("branch %q: %w", name, ErrExists)
		}
		// A leftover from a deleted branch of the same name goes.
		if err := os.RemoveAll(f.branchDir(name)); err != nil {
			return fmt.Errorf("branch %q: clear old state %s: %w", name, f.branchDir(name), err)
		}
	}
	// The refs of every branch in one update.
	for try := 0; ; try++ {
		ups := make([]chunkstore.RefUpdate, 0, 2*len(names))
		for _, name := range names {
			if _, ok, err := f.getRef(refBranch + name); err != nil {
				return err
			} else if ok {
				return fmt.Errorf("branch %q: %w", name, ErrExists)
			}
			base, _, err := f.getRef(refBase + name)
			if err != nil {
				return err
			}
			ups = append(ups, chunkstore.RefUpdate{Name: refBranch + name, New: snap},
				chunkstore.RefUpdate{Name: refBase + name, Old: base, New: snap})
			// No meta (no quota, nothing charged yet) and no fsync log.
			for _, r := range []string{refMeta + name, refPending + name} {
				if old, ok, err := f.getRef(r); err != nil {
					return err
				} else if ok {
					ups = append(ups, chunkstore.RefUpdate{Name: r, Old: old})
				}
			}
		}
		update := f.store.UpdateRefs
		if !durable {
			update = f.store.UpdateRefsDeferred
		}
		err := update(ups...)
		if err == nil {
			return nil
		}
		if !errors.Is(err, chunkstore.ErrConflict) || try > 5 {
			return fmt.Errorf("branch %q: set refs: %w", names[0], err)
		}
	}
}

// SetQuota limits the bytes a branch may be charged (0: no limit): data
// written, file growth by truncate and fallocate, names, xattrs and the
// directory objects each commit stores (docs/limits.md). Changes beyond it
// fail with ENOSPC. It applies to a mounted branch at once.
func (f *FS) SetQuota(ctx context.Context, name string, bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("set quota of %q: negative quota %d", name, bytes)
	}
	if b := f.liveBranch(name); b != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.meta.QuotaBytes = bytes
		return b.saveMeta()
	}
	if _, ok, err := f.getRef(refBranch + name); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("set quota of %q: %w", name, ErrNoBranch)
	}
	m, err := f.readMeta(name)
	if err != nil {
		return err
	}
	m.QuotaBytes = bytes
	return f.writeMeta(name, m)
}

// Rollback makes the branch's state snapshot snap again. Changes since the
// last snapshot are dropped. A mounted branch is switched in place: open
// files keep their old contents, new lookups see snap.
func (f *FS) Rollback(ctx context.Context, name string, snap SnapshotID) error {
	if _, ok, err := f.getRef(refSnap + snap.String()); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("rollback %q to %s: %w", name, snap, ErrNoSnapshot)
	}
	if b := f.liveBranch(name); b != nil {
		if err := b.reset(ctx, snap); err != nil {
			return err
		}
	} else {
		if _, ok, err := f.getRef(refBranch + name); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("rollback %q: %w", name, ErrNoBranch)
		}
		if err := f.setRef(refBranch+name, snap); err != nil {
			return err
		}
		// The fsync log completes the head left: it goes too.
		if old, ok, err := f.getRef(refPending + name); err != nil {
			return err
		} else if ok {
			if err := f.store.DeleteRef(refPending+name, old); err != nil {
				return fmt.Errorf("rollback %q: drop fsync log: %w", name, err)
			}
		}
	}
	return f.setRef(refBase+name, snap) // durable when it returns
}

// DeleteBranch removes an unmounted branch. Its snapshots stay.
func (f *FS) DeleteBranch(ctx context.Context, name string) error {
	if f.mounted(name) {
		return fmt.Errorf("delete %q: %w", name, ErrBusy)
	}
	var ups []chunkstore.RefUpdate
	for _, r := range []string{refBranch + name, refBase + name, refMeta + name, refPending + name} {
		id, ok, err := f.getRef(r)
		if err != nil {
			return err
		}
		if ok {
			ups = append(ups, chunkstore.RefUpdate{Name: r, Old: id})
		}
	}
	if err := f.store.UpdateRefs(ups...); err != nil {
		return fmt.Errorf("delete branch %q: %w", name, err)
	}
	if err := os.RemoveAll(f.branchDir(name)); err != nil {
		return fmt.Errorf("delete branch dir %s: %w", f.branchDir(name), err)
	}
	return nil
}

// BranchInfo describes one branch for listings.
type BranchInfo struct {
	Name       string     `json:"name"`
	Head       SnapshotID `json:"-"`
	HeadHex    string     `json:"head"`
	Base       string     `json:"base,omitempty"` // snapshot it last started from
	Mounted    bool       `json:"mounted"`
	QuotaBytes int64      `json:"quota_bytes,omitempty"`
	UsedBytes  int64      `json:"used_bytes"`
}

// SnapshotInfo describes one snapshot for listings.
type SnapshotInfo struct {
	ID    SnapshotID `json:"-"`
	IDHex string     `json:"id"`
	Names []string   `json:"names,omitempty"`
}

// List returns the branches and snapshots, sorted by name and id.
func (f *FS) List(ctx context.Context) ([]BranchInfo, []SnapshotInfo, error) {
	refs, err := f.store.ListRefs("cowfs/")
	if err != nil {
		return nil, nil, fmt.Errorf("list refs: %w", err)
	}
	var bs []BranchInfo
	snaps := map[SnapshotID]*SnapshotInfo{}
	for r, id := range refs {
		switch {
		case strings.HasPrefix(r, refBranch):
			n := strings.TrimPrefix(r, refBranch)
			lb := f.liveBranch(n)
			bi := BranchInfo{Name: n, Head: id, HeadHex: id.String(), Mounted: lb != nil}
			if base, ok := refs[refBase+n]; ok {
				bi.Base = base.String()
			}
			if lb != nil { // the live count: the file lags until the next commit
				lb.mu.Lock()
				bi.QuotaBytes, bi.UsedBytes = lb.meta.QuotaBytes, lb.meta.UsedBytes
				lb.mu.Unlock()
			} else if m, err := f.readMeta(n); err == nil {
				bi.QuotaBytes, bi.UsedBytes = m.QuotaBytes, m.UsedBytes
			}
			bs = append(bs, bi)
		case strings.HasPrefix(r, refSnap):
			if snaps[id] == nil {
				snaps[id] = &SnapshotInfo{ID: id, IDHex: id.String()}
			}
		}
	}
	for r, id := range refs {
		if strings.HasPrefix(r, refName) {
			if snaps[id] == nil {
				snaps[id] = &SnapshotInfo{ID: id, IDHex: id.String()}
			}
			snaps[id].Names = append(snaps[id].Names, strings.TrimPrefix(r, refName))
		}
	}
	var ss []SnapshotInfo
	for _, s := range snaps {
		sort.Strings(s.Names)
		ss = append(ss, *s)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].Name < bs[j].Name })
	sort.Slice(ss, func(i, j int) bool { return ss[i].IDHex < ss[j].IDHex })
	return bs, ss, nil
}

// rootEntry reads the single entry of a snapshot's root object.
func (f *FS) rootEntry(id SnapshotID) (Entry, error) {
	es, err := f.getDir(id)
	if err != nil {
		return Entry{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if len(es) != 1 || es[0].Name != rootName || es[0].Type != TypeDir {
		return Entry{}, fmt.Errorf("snapshot %s: %w: root object does not hold one directory named %q", id, errCorrupt, rootName)
	}
	return es[0], nil
}

// rootName is the name of the one entry of a snapshot's root object, which
// carries the attributes of the top directory.
const rootName = "root"

func putRoot(s nodeStore, top Entry) (SnapshotID, error) {
	top.Name = rootName
	return putDir(s, []Entry{top})
}

// DeleteSnapshot drops the snapshot's id ref and every name pointing at
// it. Branches made from it are unaffected; its data goes at the store's
// next GC once nothing else reaches it.
func (f *FS) DeleteSnapshot(ctx context.Context, id SnapshotID) error {
	refs, err := f.store.ListRefs("cowfs/")
	if err != nil {
		return fmt.Errorf("list refs: %w", err)
	}
	found := false
	for r, v := range refs {
		if v != id || !(strings.HasPrefix(r, refSnap) || strings.HasPrefix(r, refName)) {
			continue
		}
		found = true
		if err := f.store.DeleteRef(r, id); err != nil {
			return fmt.Errorf("delete ref %s: %w", r, err)
		}
	}
	if !found {
		return fmt.Errorf("delete snapshot %s: %w", id, ErrNoSnapshot)
	}
	return nil
}

// budget turns an option into a budget: zero means def, negative none.
func budget(opt, def int64) int64 {
	switch {
	case opt == 0:
		return def
	case opt < 0:
		return 0
	}
	return opt
}
