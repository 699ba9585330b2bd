package fsbench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"tine/bench/internal/peer"
	"tine/cowfs"
)

// The agent section runs what an agent does all day in a sandbox (unpack
// a project, git, grep, stat, build, install packages, delete) on a
// project of about 10k files, on tine and on every peer, interleaved: each
// repetition runs the whole loop once per filesystem, in an order that
// rotates, so that load from elsewhere on the machine falls on all of them
// alike. ext4 on a loop image is the native floor.

// Tools of the agent section.
const (
	toolExt4 = "ext4"
	// toolTineDevFUSE is tine served over /dev/fuse, as before ADR 0181
	// (FUSE over io_uring). It measures that lever in the same run.
	toolTineDevFUSE = "tine, /dev/fuse"
)

// agentFS is one filesystem under test in the agent section.
type agentFS interface {
	// setup mounts the filesystem with base's content (the big file) and
	// returns the directory the workloads run in.
	setup(ctx context.Context, base string) (string, error)
	// remount unmounts and mounts it again, so the next read is the first
	// read after a mount; it returns the directory again.
	remount(ctx context.Context) (string, error)
}

// agentRows are the rows of the agent section, in table order.
type agentRows struct {
	untar, gitCommit, gitStatus, grep, statAll, grepBase, create, stat, unlink,
	build, install, rmrf, seqWrite, smallWrite, firstRead, coldRead *row
}

func (a *agentRows) all() []*row {
	return []*row{a.untar, a.gitCommit, a.gitStatus, a.grep, a.statAll, a.grepBase, a.create, a.stat, a.unlink,
		a.build, a.install, a.rmrf, a.seqWrite, a.smallWrite, a.firstRead, a.coldRead}
}

// agentTools are the columns of the agent section, in table order.
var agentTools = []string{toolTine, toolTineDevFUSE, toolExt4, toolBtrfs, toolOverlay, toolFuseOverlay}

func agentSection(ctx context.Context, e *env) (*section, error) {
	cfg := e.cfg
	n := cfg.AgentFiles
	big := min(cfg.BigFile, 256<<20)
	sec := &section{
		Title: fmt.Sprintf("Agent workloads, project of %s files", count(n)),
		Note: "Every filesystem runs the whole loop once per repetition, the filesystems interleaved in a rotating " +
			"order. ext4 is a fresh loop image on the same disk (the native floor); the ratio is tine/peer. " +
			"project: a synthetic tree plus a Go module, unpacked from a tarball; git add+commit and git status " +
			"(10 files changed) run git; grep -r reads every file; stat all: lstat of every file of the project; " +
			"grep -r, as imported: the same tree in the filesystem's starting content (for tine the imported " +
			"snapshot, unchanged files; a sandbox's project starts so), after one untimed grep; " +
			"create/stat/unlink: empty files, 500 per directory; go build: the module with its GOCACHE on the " +
			"filesystem, every package changed; package install: go mod download of tine's own modules from a " +
			"local file:// GOPROXY (no network) into a GOMODCACHE on the filesystem; rm -rf: the project and its " +
			"module cache; seq write: 1 MiB writes then fsync, and again in 8 KiB writes; first read: after a fresh mount, caches dropped; " +
			"cold read: caches dropped.",
	}
	goal15 := &goal{Text: "<= 1.5x ext4, < fuse-overlayfs", Peer: toolExt4, MaxRatio: 1.5, Faster: toolFuseOverlay}
	r := &agentRows{
		untar:     newRow(fmt.Sprintf("untar project (%s files)", count(n)), unitSeconds, "warm", goal15),
		gitCommit: newRow("git add -A && git commit", unitSeconds, "warm", goal15),
		gitStatus: newRow("git status", unitSeconds, "warm", goal15),
		grep:      newRow("grep -r", unitSeconds, "warm", goal15),
		statAll:   newRow("stat every file", unitSeconds, "warm", goal15),
		grepBase:  newRow("grep -r, project as imported", unitSeconds, "warm", goal15),
		create:    newRow(fmt.Sprintf("create %s files", count(n)), unitSeconds, "warm", goal15),
		stat:      newRow(fmt.Sprintf("stat %s new files", count(n)), unitSeconds, "warm", goal15),
		unlink:    newRow(fmt.Sprintf("unlink %s files", count(n)), unitSeconds, "warm", goal15),
		build:     newRow("go build", unitSeconds, "warm", goal15),
		install:   newRow("package install (go mod download, local cache)", unitSeconds, "warm", goal15),
		rmrf:      newRow("rm -rf project", unitSeconds, "warm", goal15),
		seqWrite:  newRow("seq write "+size(big)+" + fsync", unitBytesPS, "-", &goal{Text: ">= 0.8x ext4", Peer: toolExt4, MinRatio: 0.8}),
		// No goal in the issue: shown so that small writes, which a FUSE
		// mount without a writeback cache (ADR 0161) sends one request
		// each, are not hidden behind the 1 MiB ones.
		smallWrite: newRow("seq write "+size(big)+" in 8 KiB writes + fsync", unitBytesPS, "-", nil),
		firstRead:  newRow("first read "+size(big)+" after mount", unitBytesPS, "cold", &goal{Text: ">= 0.9x ext4", Peer: toolExt4, MinRatio: 0.9}),
		coldRead:   newRow("cold read "+size(big), unitBytesPS, "cold", &goal{Text: ">= 0.9x ext4", Peer: toolExt4, MinRatio: 0.9}),
	}
	sec.Rows = r.all()

	// The data every filesystem gets: the project tarball, the big file,
	// the seed GOCACHE, the module list and the local proxy.
	src, err := e.tree(ctx, n)
	if err != nil {
		return sec, err
	}
	if err := writeModule(filepath.Join(src, "app"), 0); err != nil {
		return sec, err
	}
	tarball := filepath.Join(e.work, "agent", "project.tar")
	if err := os.MkdirAll(filepath.Dir(tarball), 0o755); err != nil {
		return sec, err
	}
	if _, err := peer.Run(ctx, "", "tar", "-cf", tarball, "-C", src, "."); err != nil {
		return sec, fmt.Errorf("make project tarball of %s: %w", src, err)
	}
	baseDir, err := e.dir("agent", "base")
	if err != nil {
		return sec, err
	}
	if err := writeRandomFile(filepath.Join(baseDir, bigName), big, 7); err != nil {
		return sec, err
	}
	if err := os.Mkdir(filepath.Join(baseDir, baseProject), 0o755); err != nil {
		return sec, err
	}
	if _, err := peer.Run(ctx, "", "tar", "-xf", tarball, "-C", filepath.Join(baseDir, baseProject)); err != nil {
		return sec, fmt.Errorf("unpack the project into the base: %w", err)
	}
	gb, err := e.goBuild(ctx)
	if err != nil {
		return sec, err
	}
	inst, err := newInstall(ctx, filepath.Join(e.work, "agent", "install"), cfg.Mode == "tiny")
	if err != nil {
		return sec, err
	}

	// Mount every filesystem first; a peer that cannot be set up fails
	// its column only.
	type col struct {
		tool string
		fs   agentFS
		dir  string
	}
	var cols []*col
	for _, tool := range agentTools {
		if !cfg.Tools[tool] {
			continue
		}
		work, err := e.dir("agent", slug(tool))
		if err != nil {
			return sec, err
		}
		var a agentFS
		switch tool {
		case toolTine:
			a = &tineAgent{cl: e.cl, base: work}
		case toolTineDevFUSE:
			a = &tineAgent{cl: e.cl, base: work, opts: &cowfs.MountOptions{NoURing: true}}
		case toolExt4:
			a = &ext4Agent{cl: e.cl, work: work}
		case toolBtrfs:
			a = &btrfsAgent{cl: e.cl, work: work}
		case toolOverlay:
			a = &overlayAgent{m: overlayMounter{cl: e.cl, base: work}}
		case toolFuseOverlay:
			a = &overlayAgent{m: overlayMounter{cl: e.cl, base: work, fuse: true}}
		}
		e.cfg.logf("agent: setting up %s", tool)
		dir, err := a.setup(ctx, baseDir)
		if err == nil {
			err = gb.seed(ctx, dir)
		}
		if err != nil {
			for _, rw := range sec.Rows {
				record(rw, tool, nil, err)
			}
			if fatal(ctx, err) {
				return sec, err
			}
			continue
		}
		cols = append(cols, &col{tool: tool, fs: a, dir: dir})
	}
	samples := map[*row]map[string][]float64{}
	failed := map[string]error{}
	add := func(rw *row, tool string, v float64) {
		if samples[rw] == nil {
			samples[rw] = map[string][]float64{}
		}
		samples[rw][tool] = append(samples[rw][tool], v)
	}
	statLat := map[string][]float64{}
	buf := make([]byte, big)
	for rep := 0; rep < cfg.AgentReps; rep++ {
		for k := range cols {
			c := cols[(k+rep)%len(cols)]
			if failed[c.tool] != nil {
				continue
			}
			e.cfg.logf("agent: repetition %d/%d, %s", rep+1, cfg.AgentReps, c.tool)
			e.cfg.step(rep*len(cols)+k, cfg.AgentReps*len(cols), fmt.Sprintf("agent loop: %s, repetition %d", c.tool, rep+1))
			fillRandom(buf, 300, uint64(rep))
			lat, err := agentLoop(ctx, c.fs, &c.dir, rep, n, tarball, gb, inst, buf, r, func(rw *row, v float64) { add(rw, c.tool, v) })
			statLat[c.tool] = append(statLat[c.tool], lat...)
			if err != nil {
				failed[c.tool] = err
				if fatal(ctx, err) {
					break
				}
			}
		}
	}
	for _, c := range cols {
		for _, rw := range sec.Rows {
			v := samples[rw][c.tool]
			if rw.Unit == unitBytesPS {
				v = throughput(big, v)
			}
			res := record(rw, c.tool, v, failed[c.tool])
			if rw == r.statAll {
				res.Quantiles = quantiles(statLat[c.tool], 100)
			}
		}
	}
	return sec, ctx.Err()
}

// agentLoop runs one repetition of the loop in *dir and reports each
// timed step to add. It returns the latency of every lstat of the stat
// every file step.
func agentLoop(ctx context.Context, a agentFS, dir *string, rep, metaFiles int, tarball string, gb *goBuild, inst *install,
	buf []byte, r *agentRows, add func(*row, float64)) ([]float64, error) {
	proj := filepath.Join(*dir, fmt.Sprintf("project-%d", rep))
	timed := func(rw *row, op func() error) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		if err := op(); err != nil {
			return fmt.Errorf("%s: %w", rw.Name, err)
		}
		add(rw, time.Since(t0).Seconds())
		return nil
	}
	git := func(args ...string) error {
		_, err := peer.Git(ctx, proj, args...)
		return err
	}
	grepR := func(dir string) error {
		// grep exits 1 when nothing matches; the pattern is chosen to
		// match nothing, so every byte is read.
		err := peer.RunTo(ctx, dir, nil, nil, nil, "grep", "-r", "-q", "zq-no-such-word-qz", ".")
		if ee, ok := err.(interface{ ExitCode() int }); ok && ee.ExitCode() == 1 {
			return nil
		}
		if err == nil {
			return fmt.Errorf("grep found a word that is not there")
		}
		return err
	}
	if err := os.Mkdir(proj, 0o755); err != nil {
		return nil, err
	}
	if err := timed(r.untar, func() error {
		_, err := peer.Run(ctx, "", "tar", "-xf", tarball, "-C", proj)
		return err
	}); err != nil {
		return nil, err
	}
	if err := git("init", "-q"); err != nil {
		return nil, err
	}
	if err := timed(r.gitCommit, func() error {
		if err := git("add", "-A"); err != nil {
			return err
		}
		return git("-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q", "-m", "import")
	}); err != nil {
		return nil, err
	}
	files, err := listFiles(proj)
	if err != nil {
		return nil, err
	}
	for i := 0; i < 10 && i < len(files); i++ {
		p := files[i*len(files)/10]
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err == nil {
			_, err = f.WriteString("changed\n")
			f.Close()
		}
		if err != nil {
			return nil, fmt.Errorf("change %s: %w", p, err)
		}
	}
	if err := timed(r.gitStatus, func() error { return git("status", "--porcelain") }); err != nil {
		return nil, err
	}
	if err := timed(r.grep, func() error { return grepR(proj) }); err != nil {
		return nil, err
	}
	var lat []float64
	if err := timed(r.statAll, func() error {
		var st unix.Stat_t
		lat = make([]float64, 0, len(files))
		for _, p := range files {
			t0 := time.Now()
			if err := unix.Lstat(p, &st); err != nil {
				return fmt.Errorf("lstat %s: %w", p, err)
			}
			lat = append(lat, time.Since(t0).Seconds())
		}
		return nil
	}); err != nil {
		return nil, err
	}
	imported := filepath.Join(*dir, baseProject)
	if err := grepR(imported); err != nil {
		return lat, err
	}
	if err := timed(r.grepBase, func() error { return grepR(imported) }); err != nil {
		return lat, err
	}
	c, s, u, err := metadata(ctx, filepath.Join(*dir, fmt.Sprintf("meta-%d", rep)), metaFiles)
	if err != nil {
		return lat, err
	}
	add(r.create, c)
	add(r.stat, s)
	add(r.unlink, u)
	app := filepath.Join(proj, "app")
	cache := filepath.Join(*dir, "gocache")
	if err := gb.build(ctx, app, cache); err != nil { // untimed: the cache learns this tree
		return lat, err
	}
	if err := writeRevs(app, rep+1); err != nil {
		return lat, err
	}
	if err := timed(r.build, func() error { return gb.build(ctx, app, cache) }); err != nil {
		return lat, err
	}
	if err := timed(r.install, func() error { return inst.run(ctx, filepath.Join(proj, "gomodcache")) }); err != nil {
		return lat, err
	}
	if err := timed(r.rmrf, func() error {
		_, err := peer.Run(ctx, "", "rm", "-rf", proj)
		return err
	}); err != nil {
		return lat, err
	}
	seq := filepath.Join(*dir, "seqw.bin")
	if err := timed(r.seqWrite, func() error { return writeFileSync(seq, buf, 1<<20) }); err != nil {
		return lat, err
	}
	if err := os.Remove(seq); err != nil {
		return lat, err
	}
	if err := timed(r.smallWrite, func() error { return writeFileSync(seq, buf, 8<<10) }); err != nil {
		return lat, err
	}
	if err := os.Remove(seq); err != nil {
		return lat, err
	}
	d, err := a.remount(ctx)
	if err != nil {
		return lat, err
	}
	*dir = d
	bigPath := filepath.Join(*dir, bigName)
	if err := peer.DropCaches(); err != nil {
		return lat, err
	}
	if err := timed(r.firstRead, func() error { return readAll(bigPath, int64(len(buf))) }); err != nil {
		return lat, err
	}
	if err := peer.DropCaches(); err != nil {
		return lat, err
	}
	if err := timed(r.coldRead, func() error { return readAll(bigPath, int64(len(buf))) }); err != nil {
		return lat, err
	}
	return lat, nil
}

// listFiles returns every regular file and symlink under dir, sorted.
func listFiles(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// quantiles returns the k+1 quantiles 0, 1/k, ..., 1 of v (nearest rank),
// or nil when v is empty.
func quantiles(v []float64, k int) []float64 {
	if len(v) == 0 {
		return nil
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	out := make([]float64, k+1)
	for i := range out {
		out[i] = s[min(len(s)-1, i*(len(s)-1)/k)]
	}
	return out
}

// seed copies the seed GOCACHE into dir/gocache.
func (g *goBuild) seed(ctx context.Context, dir string) error {
	if _, err := peer.Run(ctx, "", "cp", "-a", g.seedCache, filepath.Join(dir, "gocache")); err != nil {
		return fmt.Errorf("copy go build cache into %s: %w", dir, err)
	}
	return nil
}

// install is a package install from a warm local cache: go mod download
// of this project's own module graph from a file:// GOPROXY, so nothing
// comes from the network.
type install struct {
	mod   string // a directory holding a copy of go.mod and go.sum
	proxy string // GOPROXY URL
}

func newInstall(ctx context.Context, dir string, small bool) (*install, error) {
	out, err := peer.Run(ctx, "", "go", "env", "GOMODCACHE")
	if err != nil {
		return nil, fmt.Errorf("package install: go env GOMODCACHE: %w", err)
	}
	dl := filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
	root, err := peer.Run(ctx, "", "go", "list", "-m", "-f", "{{.Dir}}")
	if err != nil {
		return nil, fmt.Errorf("package install: find the module root: %w", err)
	}
	in := &install{mod: filepath.Join(dir, "mod"), proxy: "file://" + dl}
	if err := os.MkdirAll(in.mod, 0o755); err != nil {
		return nil, err
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(root)), f))
		if err != nil {
			return nil, fmt.Errorf("package install: %w", err)
		}
		if small {
			b = smallModule(f, b)
		}
		if err := os.WriteFile(filepath.Join(in.mod, f), b, 0o644); err != nil {
			return nil, err
		}
	}
	// One untimed run checks that the local proxy holds every module.
	if err := in.run(ctx, filepath.Join(dir, "check")); err != nil {
		return nil, fmt.Errorf("package install from %s (run go mod download once with network to fill it): %w", dl, err)
	}
	return in, os.RemoveAll(filepath.Join(dir, "check"))
}

// smallModule cuts go.mod or go.sum down to one small dependency
// (go-cmp), for the tiny mode's quick check.
func smallModule(name string, b []byte) []byte {
	const dep = "github.com/google/go-cmp"
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(l)
		switch {
		case name == "go.sum" && !strings.HasPrefix(t, dep+" "):
		case name == "go.mod" && strings.HasPrefix(t, "module "), name == "go.mod" && strings.HasPrefix(t, "go "):
			out = append(out, t)
		case name == "go.mod" && strings.HasPrefix(t, dep+" "):
			out = append(out, "require "+t)
		case name == "go.sum":
			out = append(out, t)
		}
	}
	return []byte(strings.Join(out, "\n") + "\n")
}

// run downloads every module into modcache.
func (in *install) run(ctx context.Context, modcache string) error {
	env := []string{"GOMODCACHE=" + modcache, "GOPROXY=" + in.proxy, "GOSUMDB=off", "GOFLAGS=-modcacherw",
		"GOTOOLCHAIN=local", "GOWORK=off", "GONOSUMDB=", "GOPRIVATE="}
	_, err := peer.RunEnv(ctx, in.mod, env, "go", "mod", "download")
	return err
}

// tineAgent is a cowfs branch of the imported base, mounted.
type tineAgent struct {
	cl   *peer.Cleanups
	base string
	opts *cowfs.MountOptions // nil: the defaults
	t    *tineFS
	dir  string
}

func (a *tineAgent) setup(ctx context.Context, base string) (string, error) {
	t, err := openTine(a.cl, a.base)
	if err != nil {
		return "", err
	}
	a.t = t
	t.opts = a.opts
	_, dir, err := t.importTree(ctx, base, "live")
	a.dir = dir
	return dir, err
}

func (a *tineAgent) remount(ctx context.Context) (string, error) {
	if err := a.t.unmount("live"); err != nil {
		return "", err
	}
	m, err := a.t.fs.Mount(ctx, "live", a.dir, a.opts)
	if err != nil {
		return "", err
	}
	a.t.mounts["live"] = m
	// Runs before the state root's close, which then finds it unmounted.
	a.cl.Add("cowfs mount "+a.dir, func() error { return a.t.unmount("live") })
	return a.dir, nil
}

// ext4Agent is a fresh ext4 loop image holding a copy of the base.
type ext4Agent struct {
	cl   *peer.Cleanups
	work string
	x    *peer.Ext4
}

func (a *ext4Agent) setup(ctx context.Context, base string) (string, error) {
	x, err := peer.NewExt4(ctx, a.cl, a.work, 8<<30)
	if err != nil {
		return "", err
	}
	a.x = x
	return x.Dir, copyBase(ctx, base, x.Dir)
}

func (a *ext4Agent) remount(ctx context.Context) (string, error) { return a.x.Dir, a.x.Remount() }

// btrfsAgent is a fresh btrfs loop image holding a copy of the base.
type btrfsAgent struct {
	cl   *peer.Cleanups
	work string
	b    *peer.Btrfs
}

func (a *btrfsAgent) setup(ctx context.Context, base string) (string, error) {
	b, err := peer.NewBtrfs(ctx, a.cl, a.work, 8<<30)
	if err != nil {
		return "", err
	}
	a.b = b
	return b.Dir, copyBase(ctx, base, b.Dir)
}

func (a *btrfsAgent) remount(ctx context.Context) (string, error) {
	if err := unix.Unmount(a.b.Dir, 0); err != nil {
		return "", fmt.Errorf("unmount %s: %w", a.b.Dir, err)
	}
	if err := unix.Mount(a.b.Loop, a.b.Dir, "btrfs", 0, ""); err != nil {
		return "", fmt.Errorf("mount %s on %s again: %w", a.b.Loop, a.b.Dir, err)
	}
	return a.b.Dir, nil
}

// overlayAgent is kernel overlayfs or fuse-overlayfs with the base as its
// lower layer.
type overlayAgent struct {
	m    overlayMounter
	base string
}

func (a *overlayAgent) setup(ctx context.Context, base string) (string, error) {
	a.base = base
	v, err := a.m.mount(ctx, base)
	return v.write, err
}

func (a *overlayAgent) remount(ctx context.Context) (string, error) {
	if err := a.m.unmount(); err != nil {
		return "", err
	}
	v, err := a.m.mount(ctx, a.base)
	return v.write, err
}

// copyBase copies the base's files into dir and syncs them to disk.
func copyBase(ctx context.Context, base, dir string) error {
	if _, err := peer.Run(ctx, "", "cp", "-a", base+"/.", dir); err != nil {
		return fmt.Errorf("copy %s into %s: %w", base, dir, err)
	}
	unix.Sync()
	return nil
}
