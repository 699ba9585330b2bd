package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"tine/cowfs"
)

// Fork makes n new running sandboxes, named by ForkNames, from one
// snapshot of sandbox name taken now. Each starts with the
// parent's files at that instant and fresh processes (the agent); the
// parent runs on. The forks are made in parallel; if one fails, those
// made are removed. The snapshot's metadata is written while the forks
// start: a crash before it is durable leaves forks whose snapshot is not
// listed, with their files intact (their branches are made from its
// file system snapshot, which is durable by then).
func (m *Manager) Fork(ctx context.Context, name string, o ForkOptions) ([]*Info, error) {
	done, err := m.ops.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	n := o.N
	if n < 1 || (o.Names != nil && len(o.Names) != n) {
		return nil, fmt.Errorf("fork sandbox %q: want N >= 1 and, if given, N names (N=%d, %d names)", name, n, len(o.Names))
	}
	names, err := m.reserveForkNames(name, o)
	if err != nil {
		return nil, err
	}
	defer m.releaseForkNames(names)
	s, save, err := m.snapshot(ctx, name, SnapshotOptions{})
	if err != nil {
		return nil, err
	}
	// The snapshot's metadata is written while the forks start, which
	// are given it in memory; the fork fails, and its forks go, if that
	// write does.
	saved := make(chan error, 1)
	go func() { saved <- save() }()
	out, err := m.forkFrom(ctx, name, s, names)
	if serr := <-saved; serr != nil {
		for _, c := range out {
			serr = errors.Join(serr, m.Remove(ctx, c.Name))
		}
		return nil, errors.Join(err, serr)
	}
	if err != nil {
		// The forks are gone; so goes the snapshot taken for them.
		return nil, errors.Join(err, m.RemoveSnapshot(s.ID))
	}
	m.audit(name, "fork", map[string]any{"snapshot": s.ID, "forks": names})
	return out, nil
}

// ForkNames are the names Fork gives the forks of sandbox name: o.Names,
// or else NAME-k .. NAME-(k+N-1), numbered on after the highest NAME-j
// that exists or is being made by another fork (k is 1 when none is),
// so that forking again never collides with the forks of an earlier or
// a concurrent fork.
func (m *Manager) ForkNames(name string, o ForkOptions) ([]string, error) {
	m.forkMu.Lock()
	defer m.forkMu.Unlock()
	return m.forkNames(name, o)
}

// forkNames is ForkNames with forkMu held.
func (m *Manager) forkNames(name string, o ForkOptions) ([]string, error) {
	if o.Names != nil {
		return o.Names, nil
	}
	ents, err := os.ReadDir(filepath.Join(m.root, "sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("fork sandbox %q: %w", name, err)
	}
	next := 1
	taken := func(c string) {
		tail, ok := strings.CutPrefix(c, name+"-")
		if j, err := strconv.Atoi(tail); ok && err == nil && j >= next && tail == strconv.Itoa(j) {
			next = j + 1
		}
	}
	for _, e := range ents {
		taken(e.Name())
	}
	for c := range m.forking {
		taken(c)
	}
	names := make([]string, 0, max(o.N, 0))
	for i := range max(o.N, 0) {
		names = append(names, fmt.Sprintf("%s-%d", name, next+i))
	}
	return names, nil
}

// reserveForkNames names the forks of sandbox name (ForkNames) and holds
// the names until releaseForkNames: a name that is bad, taken by a
// sandbox or held by a fork being made is refused, before anything is
// made.
func (m *Manager) reserveForkNames(name string, o ForkOptions) ([]string, error) {
	m.forkMu.Lock()
	defer m.forkMu.Unlock()
	names, err := m.forkNames(name, o)
	if err != nil {
		return nil, err
	}
	for i, c := range names {
		if err := m.checkName(c); err != nil {
			return nil, fmt.Errorf("fork sandbox %q: fork %q: %w", name, c, err)
		}
		_, err := os.Lstat(m.dir(c))
		if err == nil || m.forking[c] || slices.Contains(names[:i], c) {
			return nil, fmt.Errorf("fork sandbox %q: a sandbox named %q %w; name the forks with --names", name, c, ErrExists)
		}
	}
	for _, c := range names {
		m.forking[c] = true
	}
	return names, nil
}

// releaseForkNames lets names go once their fork is made or failed.
func (m *Manager) releaseForkNames(names []string) {
	m.forkMu.Lock()
	defer m.forkMu.Unlock()
	for _, c := range names {
		delete(m.forking, c)
	}
}

// forkFrom makes the forks names of sandbox name from its snapshot s;
// if one fails, those made are removed.
func (m *Manager) forkFrom(ctx context.Context, name string, s *SnapshotInfo, names []string) ([]*Info, error) {
	n := len(names)
	// Every fork's branch in one update, before the forks start; durable
	// with the next durable update of the store (ADR 0190).
	snap, err := m.fs.Resolve(ctx, s.FS)
	if err != nil {
		return nil, fmt.Errorf("fork sandbox %q: %w", name, err)
	}
	branches := make([]string, n)
	for i, c := range names {
		branches[i] = branchName(c)
	}
	if err := m.fs.BranchManyDeferred(ctx, snap, branches); err != nil {
		if errors.Is(err, cowfs.ErrExists) {
			err = fmt.Errorf("%w (a sandbox of that name exists or was not removed whole)", err)
		}
		return nil, fmt.Errorf("fork sandbox %q: %w", name, err)
	}
	out := make([]*Info, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, forkParallel)
	for i := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = m.create(ctx, CreateOptions{Name: names[i], Snapshot: s.ID, forkOf: s}, name)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, c := range out {
			if c != nil {
				err = errors.Join(err, m.Remove(ctx, c.Name))
			} else if derr := m.fs.DeleteBranch(ctx, branches[i]); derr != nil && !errors.Is(derr, cowfs.ErrNoBranch) {
				err = errors.Join(err, derr)
			}
		}
		return nil, fmt.Errorf("fork sandbox %q: %w", name, err)
	}
	return out, nil
}

// forkParallel is how many forks are made at once: each mostly waits on
// the disk (fsync) and on the kernel.
const forkParallel = 16
