package fsbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"tine/bench/internal/hostload"
	"tine/bench/internal/peer"
	"tine/bench/internal/treegen"
	"tine/cowfs"
)

// env is what every section shares: the configuration, the cleanup stack,
// the run's temporary directory and the trees made so far.
type env struct {
	cfg   config
	cl    *peer.Cleanups
	work  string
	trees map[int]string // synthetic trees by file count

	btrfsFS *peer.Btrfs // made on first use, shared by the sections
	gb      *goBuild    // the seed Go build cache, made on first use
}

// goBuild returns the seed Go build cache shared by the sections, warming
// it on first use.
func (e *env) goBuild(ctx context.Context) (*goBuild, error) {
	if e.gb != nil {
		return e.gb, nil
	}
	e.cfg.logf("warming a Go build cache")
	gb, err := newGoBuild(ctx, filepath.Join(e.work, "gobuild-seed"))
	if err != nil {
		return nil, err
	}
	e.gb = gb
	return gb, nil
}

// run measures every selected section and returns the report. Every mount,
// loop device and temporary file it makes is gone when it returns, also on
// error or cancellation.
func run(ctx context.Context, cfg config, command string) (rep *report, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root: it mounts filesystems, attaches loop devices and drops caches")
	}
	if !cowfs.URingOffered() {
		// As tine serve does: tine's mounts then answer over io_uring.
		if err := cowfs.OfferURing(true); err != nil {
			cfg.logf("FUSE over io_uring stays off: %v", err)
		}
	}
	start := time.Now()
	rep = &report{Command: command, Mode: cfg.Mode, Started: start.UTC()}
	for _, t := range allTools {
		if cfg.Tools[t] {
			rep.Tools = append(rep.Tools, t)
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("work dir %s: %w", cfg.Dir, err)
	}
	work, err := os.MkdirTemp(cfg.Dir, "tine-bench-cowfs-")
	if err != nil {
		return nil, fmt.Errorf("work dir in %s: %w", cfg.Dir, err)
	}
	cl := &peer.Cleanups{}
	cl.Add("work dir "+work, func() error { return os.RemoveAll(work) })
	defer func() {
		if cerr := cl.Run(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		rep.Seconds = time.Since(start).Seconds()
		rep.Machine.LoadEnd = hostload.Average()
	}()
	rep.Machine = describeMachine(work)
	e := &env{cfg: cfg, cl: cl, work: work, trees: map[int]string{}}
	sections := []struct {
		name string
		fn   func(context.Context, *env) (*section, error)
	}{
		{secSnapFork, snapForkSection},
		{secDiff, diffSection},
		{secIO, ioSection},
		{secAgent, agentSection},
	}
	total, done := 0, 0
	for _, s := range sections {
		if cfg.Sections[s.name] {
			total++
		}
	}
	for _, s := range sections {
		if !cfg.Sections[s.name] {
			continue
		}
		cfg.step(done, total, "section "+s.name)
		done++
		sec, err := s.fn(ctx, e)
		if sec != nil {
			for _, r := range sec.Rows {
				r.evaluate()
			}
			rep.Sections = append(rep.Sections, sec)
		}
		if err != nil {
			return rep, fmt.Errorf("section %s: %w", s.name, err)
		}
	}
	cfg.step(total, total, "done")
	return rep, nil
}

// tree returns the synthetic tree of n files, generating it on first use.
func (e *env) tree(ctx context.Context, n int) (string, error) {
	if p, ok := e.trees[n]; ok {
		return p, nil
	}
	p := filepath.Join(e.work, "trees", fmt.Sprintf("synth-%d", n))
	e.cfg.logf("generating synthetic tree of %d files", n)
	if err := treegen.Generate(ctx, p, n, e.cfg.Seed, e.cfg.Workers); err != nil {
		return "", err
	}
	unix.Sync()
	e.trees[n] = p
	return p, nil
}

// goSrc returns the Go toolchain's source tree.
func goSrc() (string, error) {
	root := runtime.GOROOT()
	if out, err := peer.Run(context.Background(), "", "go", "env", "GOROOT"); err == nil {
		root = strings.TrimSpace(string(out))
	}
	src := filepath.Join(root, "src")
	if _, err := os.Stat(filepath.Join(src, "go", "build")); err != nil {
		return "", fmt.Errorf("go source tree at %s: %w", src, err)
	}
	return src, nil
}

// dir makes and returns a fresh directory under the run's work dir.
func (e *env) dir(parts ...string) (string, error) {
	p := filepath.Join(append([]string{e.work}, parts...)...)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return "", fmt.Errorf("make dir %s: %w", p, err)
	}
	return p, nil
}

// sample runs op n times and returns each run's seconds. before and after,
// when not nil, run untimed around each op; i counts from 0.
func sample(ctx context.Context, n int, before, op, after func(i int) error) ([]float64, error) {
	var out []float64
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if before != nil {
			if err := before(i); err != nil {
				return out, err
			}
		}
		t0 := time.Now()
		if err := op(i); err != nil {
			return out, err
		}
		out = append(out, time.Since(t0).Seconds())
		if after != nil {
			if err := after(i); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// record stores samples (or the error) as tool's result in r.
func record(r *row, tool string, samples []float64, err error) *result {
	res := summarize(samples)
	if err != nil {
		res.Err = err.Error()
	}
	r.Results[tool] = res
	return res
}

func newRow(name string, u unit, cache string, g *goal) *row {
	return &row{Name: name, Unit: u, Cache: cache, Results: map[string]*result{}, Goal: g}
}

func describeMachine(work string) machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), WorkDir: work}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemGiB = int((uint64(si.Totalram)*uint64(si.Unit) + 1<<29) >> 30)
	}
	m.WorkFS, _ = peer.FSType(work)
	m.LoadStart = hostload.Average()
	return m
}

// fail reports whether err ends the whole run (cancellation) rather than
// only one tool's row.
func fatal(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() != nil
}
