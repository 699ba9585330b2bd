package cowfs

import (
	"context"
	"fmt"
)

// TopEntry returns the entry of a snapshot's top directory: its
// attributes, and in ID the tree object ReadDirEntry lists.
func (f *FS) TopEntry(ctx context.Context, snap SnapshotID) (Entry, error) {
	if err := ctx.Err(); err != nil {
		return Entry{}, err
	}
	return f.rootEntry(snap)
}

// ReadDirEntry returns the entries of directory entry dir of a snapshot
// (from TopEntry or an earlier ReadDirEntry), sorted by name. Each
// directory is read from the store on its own, so a caller walking a
// tree holds one directory at a time.
func (f *FS) ReadDirEntry(ctx context.Context, dir *Entry) ([]Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if dir.Type != TypeDir {
		return nil, fmt.Errorf("read directory %q: it is a %s", dir.Name, dir.Type)
	}
	return getDir(f.store, dir.ID)
}

// BranchUsage returns the bytes charged to a branch's quota so far and the
// quota (0: none). For a mounted branch the counts are live.
func (f *FS) BranchUsage(ctx context.Context, name string) (used, quota int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	if _, ok, err := f.getRef(refBranch + name); err != nil {
		return 0, 0, err
	} else if !ok {
		return 0, 0, fmt.Errorf("usage of %q: %w", name, ErrNoBranch)
	}
	if lb := f.liveBranch(name); lb != nil {
		lb.mu.Lock()
		defer lb.mu.Unlock()
		return lb.meta.UsedBytes, lb.meta.QuotaBytes, nil
	}
	m, err := f.readMeta(name)
	if err != nil {
		return 0, 0, err
	}
	return m.UsedBytes, m.QuotaBytes, nil
}
