package fsbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"tine/bench/internal/peer"
	"tine/cowfs"
)

// tineFS is a cowfs state root with the mounts the benchmark made on it.
type tineFS struct {
	cl     *peer.Cleanups
	base   string
	fs     *cowfs.FS
	mounts map[string]*cowfs.Mount // by branch
	pool   *cowfs.MountPool        // nil unless a pooled fork was asked for
	opts   *cowfs.MountOptions     // options of branchMount's mounts; nil: the defaults
	closed bool
}

// openTine opens a fresh cowfs state root in base/state.
func openTine(cl *peer.Cleanups, base string) (*tineFS, error) {
	fs, err := cowfs.Open(filepath.Join(base, "state"), nil)
	if err != nil {
		return nil, err
	}
	t := &tineFS{cl: cl, base: base, fs: fs, mounts: map[string]*cowfs.Mount{}}
	cl.Add("cowfs state "+base, t.close)
	return t, nil
}

// importTree stores src as a snapshot and mounts a new branch of it at
// base/<branch>.
func (t *tineFS) importTree(ctx context.Context, src, branch string) (cowfs.SnapshotID, string, error) {
	snap, err := t.fs.Import(ctx, src, "")
	if err != nil {
		return snap, "", err
	}
	dir, err := t.branchMount(ctx, snap, branch)
	return snap, dir, err
}

// branchMount makes branch from snap and mounts it at base/<branch>; this
// is a fork.
func (t *tineFS) branchMount(ctx context.Context, snap cowfs.SnapshotID, branch string) (string, error) {
	if err := t.fs.Branch(ctx, snap, branch); err != nil {
		return "", err
	}
	dir := filepath.Join(t.base, branch)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("mount point %s: %w", dir, err)
	}
	m, err := t.fs.Mount(ctx, branch, dir, t.opts)
	if err != nil {
		return "", err
	}
	t.mounts[branch] = m
	t.cl.Add("cowfs mount "+dir, func() error { return peer.Unmount(dir) })
	return dir, nil
}

// poolFork makes branch from snap and serves it from a mount of the pool
// made ahead of time (cowfs.MountPool, made on first use with size mounts).
func (t *tineFS) poolFork(ctx context.Context, snap cowfs.SnapshotID, branch string) (string, error) {
	m, err := t.pool.Fork(ctx, snap, branch)
	if err != nil {
		return "", err
	}
	t.mounts[branch] = m
	dir := m.Dir()
	t.cl.Add("cowfs mount "+dir, func() error { return peer.Unmount(dir) })
	return dir, nil
}

// startPool makes the mount pool and waits until its mounts are ready.
func (t *tineFS) startPool(ctx context.Context, size int) error {
	p, err := t.fs.NewMountPool(ctx, filepath.Join(t.base, "pool"), size, nil)
	if err != nil {
		return err
	}
	t.pool = p
	return nil
}

// waitPool waits (at most 10 s) until every pooled mount is ready again.
func (t *tineFS) waitPool(ctx context.Context, size int) error {
	deadline := time.Now().Add(10 * time.Second)
	for t.pool.Ready() < size {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mount pool in %s: %d of %d mounts ready after 10 s", t.base, t.pool.Ready(), size)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// unmount unmounts branch if it is mounted.
func (t *tineFS) unmount(branch string) error {
	m, ok := t.mounts[branch]
	if !ok {
		return nil
	}
	delete(t.mounts, branch)
	return m.Unmount()
}

// close unmounts every branch and closes the state root. Later calls do
// nothing.
func (t *tineFS) close() error {
	if t.closed {
		return nil
	}
	t.closed = true
	var errs []error
	for b := range t.mounts {
		errs = append(errs, t.unmount(b))
	}
	if t.pool != nil {
		errs = append(errs, t.pool.Close())
	}
	errs = append(errs, t.fs.Close())
	return errors.Join(errs...)
}

// tineForker snapshots a mounted branch and forks by branching and
// mounting the snapshot.
type tineForker struct {
	cl     *peer.Cleanups
	base   string
	pooled bool // fork through a cowfs.MountPool
	t      *tineFS
	snaps  map[int]cowfs.SnapshotID
}

// poolSize is the number of mounts the pooled forker keeps ready.
const poolSize = 2

func newTineForker(e *env, base string, pooled bool) forker {
	return &tineForker{cl: e.cl, base: base, pooled: pooled, snaps: map[int]cowfs.SnapshotID{}}
}

func (f *tineForker) setup(ctx context.Context, src string) (string, error) {
	t, err := openTine(f.cl, f.base)
	if err != nil {
		return "", err
	}
	f.t = t
	_, dir, err := t.importTree(ctx, src, "live")
	if err == nil && f.pooled {
		err = t.startPool(ctx, poolSize)
	}
	return dir, err
}

func (f *tineForker) snapshot(ctx context.Context, i int) error {
	id, err := f.t.fs.Snapshot(ctx, "live")
	f.snaps[i] = id
	if err == nil && f.pooled {
		// Untimed in effect: the snapshot row is not recorded for the
		// pooled forker, and the fork is timed from a full pool.
		err = f.t.waitPool(ctx, poolSize)
	}
	return err
}

func (f *tineForker) fork(ctx context.Context, i int) (string, error) {
	if f.pooled {
		return f.t.poolFork(ctx, f.snaps[i], fmt.Sprintf("fork%d", i))
	}
	return f.t.branchMount(ctx, f.snaps[i], fmt.Sprintf("fork%d", i))
}

func (f *tineForker) discard(ctx context.Context, i int) error {
	return f.t.unmount(fmt.Sprintf("fork%d", i))
}

func (f *tineForker) close(ctx context.Context) error {
	if f.t == nil {
		return nil
	}
	return f.t.close()
}

// tineDiffer diffs snapshots of a mounted branch.
type tineDiffer struct {
	cl     *peer.Cleanups
	base   string
	t      *tineFS
	origin cowfs.SnapshotID
	stages map[int]cowfs.SnapshotID
}

func (d *tineDiffer) setup(ctx context.Context, src string) (string, error) {
	t, err := openTine(d.cl, d.base)
	if err != nil {
		return "", err
	}
	d.t, d.stages = t, map[int]cowfs.SnapshotID{}
	snap, dir, err := t.importTree(ctx, src, "live")
	d.origin = snap
	return dir, err
}

func (d *tineDiffer) mark(ctx context.Context, k int) error {
	id, err := d.t.fs.Snapshot(ctx, "live")
	d.stages[k] = id
	return err
}

func (d *tineDiffer) diff(ctx context.Context, k int) (string, error) {
	changes, err := d.t.fs.Diff(ctx, d.origin, d.stages[k])
	if err != nil {
		return "", err
	}
	files := 0
	for _, c := range changes {
		if c.New != nil && c.New.Type != cowfs.TypeDir {
			files++
		}
	}
	if files != k {
		return "", fmt.Errorf("cowfs Diff listed %d changed files (%d changes), want %d", files, len(changes), k)
	}
	return "", nil
}

func (d *tineDiffer) close(ctx context.Context) error {
	if d.t == nil {
		return nil
	}
	return d.t.close()
}

// tineMounter imports the base directory and mounts a branch of it.
type tineMounter struct {
	cl   *peer.Cleanups
	base string
	t    *tineFS
}

func (m *tineMounter) mount(ctx context.Context, base string) (view, error) {
	t, err := openTine(m.cl, m.base)
	if err != nil {
		return view{}, err
	}
	m.t = t
	_, dir, err := t.importTree(ctx, base, "live")
	return view{read: dir, write: dir}, err
}

func (m *tineMounter) unmount() error {
	if m.t == nil {
		return nil
	}
	return m.t.close()
}
