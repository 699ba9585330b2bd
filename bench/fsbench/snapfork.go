package fsbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"tine/bench/internal/peer"
	"tine/bench/internal/treegen"
)

// forker is one system's way to snapshot a live, writable tree and to fork
// a new writable tree from a snapshot.
type forker interface {
	// setup loads the tree at src (untimed) and returns the live directory.
	setup(ctx context.Context, src string) (string, error)
	// snapshot records the live tree, uncommitted changes included, as
	// snapshot i (timed).
	snapshot(ctx context.Context, i int) error
	// fork makes a new writable tree from snapshot i and returns its
	// directory (timed, together with a stat that proves it is ready).
	fork(ctx context.Context, i int) (string, error)
	// discard removes fork i (untimed).
	discard(ctx context.Context, i int) error
	// close releases what setup made (untimed).
	close(ctx context.Context) error
}

// testTree is a tree the snapshot and fork rows run on.
type testTree struct {
	label string
	path  string
	files int
	probe string // a file that exists in the tree, relative path
}

func snapForkSection(ctx context.Context, e *env) (*section, error) {
	sec := &section{
		Title: "Snapshot and fork latency",
		Note: "snapshot: record a live, writable tree that has uncommitted changes (a file written and one " +
			"appended to just before). fork: a new writable tree from that snapshot, ready to use (a stat " +
			"inside it succeeds). tine: Snapshot of a mounted branch; Branch + Mount. tine pool: fork by MountPool.Fork, binding the branch to one of 2 mounts made ahead of time (the pool is full again before each sample). btrfs: " +
			"BTRFS_IOC_SNAP_CREATE_V2 ioctl (read-only snapshot of the live subvolume; writable snapshot of it). " +
			"overlayfs: snapshot = unmount, live upper becomes a lower layer, mount with a fresh upper; " +
			"fork = mount with a fresh upper/work dir. cp -a: copy the tree. git: snapshot = add -A + commit; " +
			"fork = worktree add. Warm page cache; median of the samples.",
	}
	var trees []testTree
	for _, n := range e.cfg.TreeSizes {
		p, err := e.tree(ctx, n)
		if err != nil {
			return sec, err
		}
		trees = append(trees, testTree{label: fmt.Sprintf("synth %s files", count(n)), path: p, files: n, probe: treegen.Path(0)})
	}
	if e.cfg.GoTree {
		src, err := goSrc()
		if err != nil {
			return sec, err
		}
		n, err := countFiles(src)
		if err != nil {
			return sec, err
		}
		trees = append(trees, testTree{label: fmt.Sprintf("Go src %s files", count(n)), path: src, files: n, probe: "go/build/build.go"})
	}
	tools := []string{toolTine, toolTinePool, toolBtrfs, toolOverlay, toolCp, toolGit}
	for ti, tr := range trees {
		g := &goal{Text: "<= 1 ms", Max: 1e-3}
		snapRow := newRow("snapshot, "+tr.label, unitSeconds, "warm", g)
		forkRow := newRow("fork, "+tr.label, unitSeconds, "warm", g)
		sec.Rows = append(sec.Rows, snapRow, forkRow)
		for _, tool := range tools {
			if !e.cfg.Tools[tool] {
				continue
			}
			copies := tool == toolCp || tool == toolGit
			if copies && e.cfg.CopyMax > 0 && tr.files > e.cfg.CopyMax {
				continue
			}
			reps := e.cfg.Reps
			switch {
			case copies && tr.files >= 50000:
				reps = 1 // one copy of 100k files takes tens of seconds
			case copies && tr.files >= 10000:
				reps = e.cfg.SlowReps
			}
			e.cfg.logf("snapshot/fork: %s on %s, %d samples", tool, tr.label, reps)
			base, err := e.dir("snapfork", fmt.Sprintf("t%d-%s", ti, slug(tool)))
			if err != nil {
				return sec, err
			}
			snaps, forks, err := runForker(ctx, e, tool, base, tr, reps)
			if tool != toolTinePool { // its snapshot is tine's
				record(snapRow, tool, snaps, err)
			}
			record(forkRow, tool, forks, err)
			if fatal(ctx, err) {
				return sec, err
			}
			if err := os.RemoveAll(base); err != nil {
				return sec, fmt.Errorf("remove %s: %w", base, err)
			}
		}
	}
	return sec, nil
}

func runForker(ctx context.Context, e *env, tool, base string, tr testTree, reps int) (snaps, forks []float64, err error) {
	var f forker
	switch tool {
	case toolTine, toolTinePool:
		f = newTineForker(e, base, tool == toolTinePool)
	case toolBtrfs:
		b, err := e.btrfs(ctx)
		if err != nil {
			return nil, nil, err
		}
		f = &btrfsForker{b: b, base: filepath.Join(b.Dir, filepath.Base(base))}
	case toolOverlay:
		f = &overlayForker{cl: e.cl, base: base}
	case toolCp:
		f = &cpForker{base: base}
	case toolGit:
		f = &gitForker{base: base}
	default:
		return nil, nil, fmt.Errorf("no forker for %s", tool)
	}
	defer func() {
		if cerr := f.close(context.WithoutCancel(ctx)); cerr != nil && err == nil {
			err = cerr
		}
	}()
	t0 := time.Now()
	live, err := f.setup(ctx, tr.path)
	if err != nil {
		return nil, nil, err
	}
	t1 := time.Now()
	unix.Sync()
	e.cfg.logf("  setup %s, sync %s", t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	defer func(t0 time.Time) {
		e.cfg.logf("  samples %s", time.Since(t0).Round(time.Millisecond))
	}(time.Now())
	for i := 0; i < reps; i++ {
		if err := ctx.Err(); err != nil {
			return snaps, forks, err
		}
		if err := uncommittedChange(live, tr.probe, i); err != nil {
			return snaps, forks, err
		}
		t0 := time.Now()
		if err := f.snapshot(ctx, i); err != nil {
			return snaps, forks, err
		}
		snaps = append(snaps, time.Since(t0).Seconds())
		t0 = time.Now()
		dir, err := f.fork(ctx, i)
		if err == nil {
			_, err = os.Stat(filepath.Join(dir, tr.probe))
		}
		if err != nil {
			return snaps, forks, fmt.Errorf("%s fork %d: %w", tool, i, err)
		}
		forks = append(forks, time.Since(t0).Seconds())
		if err := checkFork(dir, i); err != nil {
			return snaps, forks, fmt.Errorf("%s fork %d: %w", tool, i, err)
		}
		if err := f.discard(ctx, i); err != nil {
			return snaps, forks, err
		}
	}
	return snaps, forks, nil
}

// uncommittedChange writes a new file and appends to probe in the live
// tree, so that a snapshot has something to capture.
func uncommittedChange(live, probe string, i int) error {
	p := filepath.Join(live, fmt.Sprintf("uncommitted-%d.txt", i))
	if err := os.WriteFile(p, []byte(strings.Repeat(fmt.Sprintf("change %d\n", i), 400)), 0o644); err != nil {
		return fmt.Errorf("uncommitted change %s: %w", p, err)
	}
	pp := filepath.Join(live, probe)
	f, err := os.OpenFile(pp, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("uncommitted change %s: %w", pp, err)
	}
	_, err = fmt.Fprintf(f, "\nchange %d\n", i)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("uncommitted change %s: %w", pp, err)
	}
	return nil
}

// checkFork verifies (untimed) that fork i holds the change made before
// snapshot i, so a fast but wrong snapshot cannot pass.
func checkFork(dir string, i int) error {
	p := filepath.Join(dir, fmt.Sprintf("uncommitted-%d.txt", i))
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("snapshot lost the uncommitted change: %w", err)
	}
	if want := strings.Repeat(fmt.Sprintf("change %d\n", i), 400); string(b) != want {
		return fmt.Errorf("snapshot has wrong bytes in %s", p)
	}
	return nil
}

// btrfsForker keeps the tree in a subvolume; snapshots are read-only
// subvolume snapshots and forks writable snapshots of those.
type btrfsForker struct {
	b    *peer.Btrfs
	base string // directory inside the btrfs mount
	live string
}

func (f *btrfsForker) setup(ctx context.Context, src string) (string, error) {
	if err := os.MkdirAll(f.base, 0o755); err != nil {
		return "", fmt.Errorf("btrfs dir %s: %w", f.base, err)
	}
	f.live = filepath.Join(f.base, "live")
	if err := f.b.CreateSubvolume(ctx, f.live); err != nil {
		return "", err
	}
	if _, err := peer.Run(ctx, "", "cp", "-a", src+"/.", f.live+"/"); err != nil {
		return "", fmt.Errorf("load tree into btrfs: %w", err)
	}
	return f.live, nil
}

func (f *btrfsForker) snapshot(ctx context.Context, i int) error {
	return peer.Snapshot(f.live, filepath.Join(f.base, fmt.Sprintf("snap%d", i)), true)
}

func (f *btrfsForker) fork(ctx context.Context, i int) (string, error) {
	dst := filepath.Join(f.base, fmt.Sprintf("fork%d", i))
	return dst, peer.Snapshot(filepath.Join(f.base, fmt.Sprintf("snap%d", i)), dst, false)
}

func (f *btrfsForker) discard(ctx context.Context, i int) error { return nil }

// close leaves the subvolumes: the whole btrfs image goes at the end.
func (f *btrfsForker) close(ctx context.Context) error { return nil }

// overlayForker stacks kernel overlayfs layers over the tree.
type overlayForker struct {
	cl     *peer.Cleanups
	base   string
	live   string
	lowers []string // topmost first
	upper  string
	n      int // layers made
}

func (f *overlayForker) layer() (upper, work string) {
	f.n++
	return filepath.Join(f.base, fmt.Sprintf("up%d", f.n)), filepath.Join(f.base, fmt.Sprintf("wk%d", f.n))
}

func (f *overlayForker) setup(ctx context.Context, src string) (string, error) {
	f.live = filepath.Join(f.base, "live")
	f.lowers = []string{src}
	up, wk := f.layer()
	f.upper = up
	return f.live, peer.MountOverlay(f.cl, peer.Overlay{Lower: f.lowers, Upper: up, Work: wk, Dir: f.live})
}

func (f *overlayForker) snapshot(ctx context.Context, i int) error {
	if err := unix.Unmount(f.live, 0); err != nil {
		return fmt.Errorf("unmount overlayfs %s: %w", f.live, err)
	}
	f.lowers = append([]string{f.upper}, f.lowers...)
	up, wk := f.layer()
	f.upper = up
	return peer.MountOverlay(f.cl, peer.Overlay{Lower: f.lowers, Upper: up, Work: wk, Dir: f.live})
}

func (f *overlayForker) fork(ctx context.Context, i int) (string, error) {
	dir := filepath.Join(f.base, fmt.Sprintf("fork%d", i))
	up, wk := f.layer()
	return dir, peer.MountOverlay(f.cl, peer.Overlay{Lower: f.lowers, Upper: up, Work: wk, Dir: dir})
}

func (f *overlayForker) discard(ctx context.Context, i int) error {
	return peer.Unmount(filepath.Join(f.base, fmt.Sprintf("fork%d", i)))
}

func (f *overlayForker) close(ctx context.Context) error { return peer.Unmount(f.live) }

// cpForker copies the whole tree for a snapshot and again for a fork.
type cpForker struct{ base, live string }

func (f *cpForker) setup(ctx context.Context, src string) (string, error) {
	f.live = filepath.Join(f.base, "live")
	if _, err := peer.Run(ctx, "", "cp", "-a", src, f.live); err != nil {
		return "", fmt.Errorf("copy tree: %w", err)
	}
	return f.live, nil
}

func (f *cpForker) snapshot(ctx context.Context, i int) error {
	_, err := peer.Run(ctx, "", "cp", "-a", f.live, filepath.Join(f.base, fmt.Sprintf("snap%d", i)))
	return err
}

func (f *cpForker) fork(ctx context.Context, i int) (string, error) {
	dst := filepath.Join(f.base, fmt.Sprintf("fork%d", i))
	_, err := peer.Run(ctx, "", "cp", "-a", filepath.Join(f.base, fmt.Sprintf("snap%d", i)), dst)
	return dst, err
}

func (f *cpForker) discard(ctx context.Context, i int) error {
	for _, d := range []string{fmt.Sprintf("snap%d", i), fmt.Sprintf("fork%d", i)} {
		if err := os.RemoveAll(filepath.Join(f.base, d)); err != nil {
			return fmt.Errorf("remove copy: %w", err)
		}
	}
	return nil
}

func (f *cpForker) close(ctx context.Context) error { return nil }

// gitForker commits the live tree for a snapshot and checks it out into a
// new worktree for a fork.
type gitForker struct{ base, live string }

func (f *gitForker) setup(ctx context.Context, src string) (string, error) {
	f.live = filepath.Join(f.base, "live")
	if err := gitRepo(ctx, src, f.live); err != nil {
		return "", err
	}
	return f.live, nil
}

// gitRepo copies src to dir and commits it as the first commit of a new
// repository.
func gitRepo(ctx context.Context, src, dir string) error {
	if _, err := peer.Run(ctx, "", "cp", "-a", src, dir); err != nil {
		return fmt.Errorf("copy tree: %w", err)
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "-m", "base"}} {
		if _, err := peer.Git(ctx, dir, args...); err != nil {
			return err
		}
	}
	return nil
}

func (f *gitForker) snapshot(ctx context.Context, i int) error {
	if _, err := peer.Git(ctx, f.live, "add", "-A"); err != nil {
		return err
	}
	_, err := peer.Git(ctx, f.live, "commit", "-q", "-m", fmt.Sprintf("snap%d", i))
	return err
}

func (f *gitForker) fork(ctx context.Context, i int) (string, error) {
	dst := filepath.Join(f.base, fmt.Sprintf("fork%d", i))
	_, err := peer.Git(ctx, f.live, "worktree", "add", "-q", "--detach", dst, "HEAD")
	return dst, err
}

func (f *gitForker) discard(ctx context.Context, i int) error {
	_, err := peer.Git(ctx, f.live, "worktree", "remove", "--force", filepath.Join(f.base, fmt.Sprintf("fork%d", i)))
	return err
}

func (f *gitForker) close(ctx context.Context) error { return nil }

// btrfs returns the run's btrfs filesystem, making it on first use.
func (e *env) btrfs(ctx context.Context) (*peer.Btrfs, error) {
	if e.btrfsFS != nil {
		return e.btrfsFS, nil
	}
	dir, err := e.dir("btrfs")
	if err != nil {
		return nil, err
	}
	b, err := peer.NewBtrfs(ctx, e.cl, dir, e.cfg.BtrfsBytes)
	if err != nil {
		return nil, err
	}
	e.btrfsFS = b
	return b, nil
}

func countFiles(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("count files in %s: %w", dir, err)
	}
	return n, nil
}

// count prints n as 200, 10k, 100k or 11.5k.
func count(n int) string {
	switch {
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	case n >= 1000:
		return fmt.Sprintf("%.1fk", float64(n)/1000)
	default:
		return fmt.Sprint(n)
	}
}

func slug(s string) string {
	return strings.NewReplacer(" ", "", "-", "").Replace(s)
}
