package fsbench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"tine/bench/internal/peer"
	"tine/bench/internal/treegen"
)

// differ is one system's way to list what changed in a tree since a base
// state.
type differ interface {
	// setup loads the tree at src as the base state (untimed) and returns
	// the live directory changes are made in.
	setup(ctx context.Context, src string) (string, error)
	// mark records the live state as stage k (untimed).
	mark(ctx context.Context, k int) error
	// diff compares stage k with the base (timed) and describes what it
	// found; it fails when it does not see exactly k changed files and can
	// tell.
	diff(ctx context.Context, k int) (string, error)
	close(ctx context.Context) error
}

func diffSection(ctx context.Context, e *env) (*section, error) {
	n := e.cfg.DiffTree
	sec := &section{
		Title: fmt.Sprintf("Diff latency, synthetic tree of %s files", count(n)),
		Note: "k files changed (a line appended to each) since the base state; time to list them. " +
			"tine: Diff of two snapshots (the second taken of the mounted branch after the changes). " +
			"git: git status --porcelain in the worktree (base committed). btrfs: btrfs send -p base " +
			"snapshot | wc -c (byte count done in-process), both read-only snapshots. Warm: one untimed run first.",
	}
	src, err := e.tree(ctx, n)
	if err != nil {
		return sec, err
	}
	rows := map[int]*row{}
	for _, k := range e.cfg.DiffChanges {
		var g *goal
		if k == 100 {
			g = &goal{Text: "<= 10 ms", Max: 10e-3}
		}
		rows[k] = newRow(fmt.Sprintf("diff, %s changed of %s", count(k), count(n)), unitSeconds, "warm", g)
		sec.Rows = append(sec.Rows, rows[k])
	}
	for _, tool := range []string{toolTine, toolBtrfs, toolGit} {
		if !e.cfg.Tools[tool] {
			continue
		}
		e.cfg.logf("diff: %s on %s files", tool, count(n))
		base, err := e.dir("diff", slug(tool))
		if err != nil {
			return sec, err
		}
		err = runDiffer(ctx, e, tool, base, src, n, rows)
		if fatal(ctx, err) {
			return sec, err
		}
		if err := os.RemoveAll(base); err != nil {
			return sec, fmt.Errorf("remove %s: %w", base, err)
		}
	}
	return sec, nil
}

func runDiffer(ctx context.Context, e *env, tool, base, src string, n int, rows map[int]*row) (err error) {
	var d differ
	switch tool {
	case toolTine:
		d = &tineDiffer{cl: e.cl, base: base}
	case toolBtrfs:
		b, err := e.btrfs(ctx)
		if err != nil {
			return failRows(rows, tool, err)
		}
		d = &btrfsDiffer{b: b, base: filepath.Join(b.Dir, "diff")}
	case toolGit:
		d = &gitDiffer{base: base}
	}
	defer func() {
		if cerr := d.close(context.WithoutCancel(ctx)); cerr != nil && err == nil {
			err = failRows(rows, tool, cerr)
		}
	}()
	live, err := d.setup(ctx, src)
	if err != nil {
		return failRows(rows, tool, err)
	}
	for _, k := range e.cfg.DiffChanges {
		if err := treegen.Modify(live, treegen.Changed(n, k), fmt.Sprint(k)); err != nil {
			return failRows(rows, tool, err)
		}
		if err := d.mark(ctx, k); err != nil {
			return failRows(rows, tool, err)
		}
		note, err := d.diff(ctx, k) // warm-up, and the correctness check
		if err != nil {
			record(rows[k], tool, nil, err)
			continue
		}
		samples, err := sample(ctx, e.cfg.Reps, nil, func(int) error {
			_, err := d.diff(ctx, k)
			return err
		}, nil)
		record(rows[k], tool, samples, err).Note = note
		if fatal(ctx, err) {
			return err
		}
	}
	return nil
}

// failRows records err for tool in every row that has no result yet, and
// returns it.
func failRows(rows map[int]*row, tool string, err error) error {
	for _, r := range rows {
		if _, ok := r.Results[tool]; !ok {
			record(r, tool, nil, err)
		}
	}
	return err
}

type gitDiffer struct{ base, live string }

func (d *gitDiffer) setup(ctx context.Context, src string) (string, error) {
	d.live = filepath.Join(d.base, "live")
	return d.live, gitRepo(ctx, src, d.live)
}

func (d *gitDiffer) mark(ctx context.Context, k int) error { return nil }

func (d *gitDiffer) diff(ctx context.Context, k int) (string, error) {
	out, err := peer.Git(ctx, d.live, "status", "--porcelain")
	if err != nil {
		return "", err
	}
	if got := bytes.Count(out, []byte("\n")); got != k {
		return "", fmt.Errorf("git status listed %d changes, want %d", got, k)
	}
	return "", nil
}

func (d *gitDiffer) close(ctx context.Context) error { return nil }

type btrfsDiffer struct {
	b          *peer.Btrfs
	base, live string
}

func (d *btrfsDiffer) setup(ctx context.Context, src string) (string, error) {
	if err := os.MkdirAll(d.base, 0o755); err != nil {
		return "", fmt.Errorf("btrfs dir %s: %w", d.base, err)
	}
	d.live = filepath.Join(d.base, "live")
	if err := d.b.CreateSubvolume(ctx, d.live); err != nil {
		return "", err
	}
	if _, err := peer.Run(ctx, "", "cp", "-a", src+"/.", d.live+"/"); err != nil {
		return "", fmt.Errorf("load tree into btrfs: %w", err)
	}
	return d.live, peer.Snapshot(d.live, filepath.Join(d.base, "base"), true)
}

func (d *btrfsDiffer) mark(ctx context.Context, k int) error {
	return peer.Snapshot(d.live, filepath.Join(d.base, fmt.Sprintf("stage%d", k)), true)
}

func (d *btrfsDiffer) diff(ctx context.Context, k int) (string, error) {
	n, err := peer.Send(ctx, filepath.Join(d.base, "base"), filepath.Join(d.base, fmt.Sprintf("stage%d", k)))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("send stream %d bytes", n), nil
}

func (d *btrfsDiffer) close(ctx context.Context) error { return nil }
