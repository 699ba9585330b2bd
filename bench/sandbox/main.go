// Command sandbox benchmarks tine's namespace sandboxes against their
// peers side by side, in one run, on the same machine: bubblewrap
// (bwrap --unshare-all), unshare(1), podman when it runs here, and git
// worktree for the file system part. It times create → first command
// answered, fork of a running sandbox into 1, 10 and 100 → every fork's
// first command answered, the exec round trip and 100 sandboxes alive at
// once, and breaks create and fork down into their steps. It prints
// p50/p90 and the ratio tine/peer; with --md it also writes the results
// as Markdown, and with --save as JSON for bench/report. It needs root.
//
//	go run ./bench/sandbox [--quick] [--md FILE] [--save FILE] [--dir DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"tine/bench/internal/hostload"
	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/sandbox"
	"tine/sandbox/ns"
)

// options size one run.
type options struct {
	reps    int // samples of create rows
	execs   int // exec round trips
	fanouts []int
	forkRep map[int]int
	alive   int
	dirty   int64 // bytes the dirtyfork section leaves dirty before each fork
	dir     string
	only    map[string]bool // sections to run; nil runs all
}

func main() {
	ns.Init()
	quick := flag.Bool("quick", false, "fewer samples, fork fan-out up to 10, 20 alive")
	md := flag.String("md", "", "also write the results as Markdown to this file")
	save := flag.String("save", "", "also write the results as JSON to this file (bench/report --sandbox)")
	dir := flag.String("dir", "/var/tmp", "directory for the state, the project and the agent binary")
	only := flag.String("only", "", "run only these sections, comma-separated: create, breakdown, fs, exec, fork, bigfork, dirtyfork, alive (the goals need create and fork)")
	fanout := flag.String("fanout", "", "fork fan-outs to measure, comma-separated (default 1,10,100; 1,10 with -quick)")
	forkReps := flag.Int("fork-reps", 0, "samples of each fork fan-out (0: the default for its size)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	uring := flag.Bool("fuse-uring", true, "serve project mounts over FUSE io_uring, as tine serve does (false: over /dev/fuse, to measure ADR 0181)")
	flag.Parse()
	o := options{reps: 30, execs: 300, fanouts: []int{1, 10, 100}, forkRep: map[int]int{1: 10, 10: 5, 100: 1}, alive: 100, dirty: 1 << 30, dir: *dir}
	if *quick {
		o = options{reps: 8, execs: 50, fanouts: []int{1, 10}, forkRep: map[int]int{1: 3, 10: 2}, alive: 20, dirty: 256 << 20, dir: *dir}
	}
	if *fanout != "" {
		o.fanouts = nil
		for _, f := range strings.Split(*fanout, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "bench/sandbox: -fanout: %q is not a number of forks (want e.g. 1,10,100)\n", f)
				os.Exit(2)
			}
			o.fanouts = append(o.fanouts, n)
			if o.forkRep[n] == 0 {
				o.forkRep[n] = max(1, 10/n)
			}
		}
	}
	if *forkReps > 0 {
		for _, n := range o.fanouts {
			o.forkRep[n] = *forkReps
		}
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, s := range strings.Split(*only, ",") {
			if !slices.Contains(sections, s) {
				fmt.Fprintf(os.Stderr, "bench/sandbox: -only: unknown section %q (want some of %s)\n", s, strings.Join(sections, ", "))
				os.Exit(2)
			}
			o.only[s] = true
		}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/sandbox: -cpuprofile:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/sandbox: needs root (namespaces, mounts, cgroups)")
		os.Exit(2)
	}
	if cowfs.URingOffered() != *uring {
		// On, as tine serve does: project mounts then answer over
		// io_uring. Off measures them over /dev/fuse (ADR 0181).
		if err := cowfs.OfferURing(*uring); err != nil {
			fmt.Fprintf(os.Stderr, "bench/sandbox: FUSE over io_uring left as it is: %v\n", err)
		}
	}
	load := hostload.Average()
	r, err := run(context.Background(), o)
	if r != nil {
		r.command = "go run ./bench/sandbox " + strings.Join(os.Args[1:], " ")
		r.loadStart, r.loadEnd = load, hostload.Average()
		r.print(os.Stdout)
		if *md != "" {
			if werr := os.WriteFile(*md, []byte(r.markdown()), 0o644); werr != nil && err == nil {
				err = werr
			}
		}
		if *save != "" {
			if werr := r.saveJSON(*save); werr != nil && err == nil {
				err = werr
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/sandbox:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// bench is the state of one run: a cowfs store, a project, and two
// managers over it, one with warm sandboxes and one without.
type bench struct {
	o       options
	base    string
	project string
	agent   string
	fs      *cowfs.FS
	warmRT  *ns.Runtime
	warm    *sandbox.Manager
	coldRT  *ns.Runtime
	cold    *sandbox.Manager
	warmN   int
	seq     int
}

func run(ctx context.Context, o options) (*report, error) {
	host, _ := os.Hostname()
	rep := &report{date: time.Now(), host: fmt.Sprintf("%s, %d CPUs, %s, FUSE over %s", host, runtime.NumCPU(), kernel(), fuseTransport())}
	base, err := os.MkdirTemp(o.dir, "tine-bench-sandbox-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	b := &bench{o: o, base: base, project: filepath.Join(base, "project"), agent: filepath.Join(base, "tine-agent")}
	cmd := exec.Command("go", "build", "-o", b.agent, "tine/cmd/tine-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the static agent: %v: %s", err, out)
	}
	if err := makeProject(b.project, 200); err != nil {
		return nil, err
	}
	if b.fs, err = cowfs.Open(filepath.Join(base, "cowfs"), nil); err != nil {
		return nil, err
	}
	defer b.fs.Close()
	if b.warmRT, err = ns.New(b.agent); err != nil {
		return nil, err
	}
	if b.coldRT, err = ns.New(b.agent); err != nil {
		return nil, err
	}
	b.warmN = 10 // enough for a fork into 10
	if b.warm, err = sandbox.Open(ctx, filepath.Join(base, "state-warm"), b.fs, sandbox.Options{Runtime: b.warmRT, MountPool: 16, Warm: b.warmN}); err != nil {
		return nil, err
	}
	defer b.warm.Close(ctx)
	if b.cold, err = sandbox.Open(ctx, filepath.Join(base, "state-cold"), b.fs, sandbox.Options{Runtime: b.coldRT, MountPool: 16}); err != nil {
		return nil, err
	}
	defer b.cold.Close(ctx)
	steps := []func(context.Context, *report) error{b.create, b.breakdown, b.fsPart, b.exec, b.fork, b.forkBig, b.forkDirty, b.alive}
	for i, s := range steps {
		if o.only != nil && !o.only[sections[i]] {
			continue
		}
		if err := s(ctx, rep); err != nil {
			return rep, err
		}
	}
	b.goals(rep)
	return rep, nil
}

// sections names the benchmark's parts, in the order they run (-only).
var sections = []string{"create", "breakdown", "fs", "exec", "fork", "bigfork", "dirtyfork", "alive"}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return "Linux " + strings.TrimSpace(string(b))
}

// makeProject writes n small files in a few directories, as a git repo.
func makeProject(dir string, n int) error {
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("d%d", i%10), fmt.Sprintf("f%d.txt", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(strings.Repeat("x", 100+i)), 0o644); err != nil {
			return err
		}
	}
	for _, a := range [][]string{{"init", "-q"}, {"add", "-A"}, {"-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "p"}} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, a...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("git %v: %v: %s", a, err, out)
		}
	}
	return nil
}

func (b *bench) name(p string) string {
	b.seq++
	return fmt.Sprintf("%s%d", p, b.seq)
}

// first runs true in sandbox name and waits for its exit.
func first(ctx context.Context, m *sandbox.Manager, name string) error {
	p, err := m.Exec(ctx, name, proto.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		return err
	}
	ex, err := p.Wait(ctx)
	if err == nil && ex.Code != 0 {
		err = fmt.Errorf("true exited %d in %s", ex.Code, name)
	}
	return err
}

func timeCmd(ctx context.Context, n int, argv ...string) ([]time.Duration, error) {
	var s []time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, out)
		}
		s = append(s, time.Since(t))
	}
	return s, nil
}

// create: create → first command answered, tine warm and cold, beside
// bwrap, unshare and podman running true.
func (b *bench) create(ctx context.Context, rep *report) error {
	const sec = "create+first"
	for _, c := range []struct {
		tool string
		m    *sandbox.Manager
		rt   *ns.Runtime
	}{{"tine (warm)", b.warm, b.warmRT}, {"tine (cold)", b.cold, nil}} {
		var s []time.Duration
		for i := 0; i < b.o.reps; i++ {
			if c.rt != nil {
				// A full pool: no refill competes with the sample.
				if err := c.rt.WaitWarm(ctx, b.warmN); err != nil {
					return err
				}
			}
			time.Sleep(20 * time.Millisecond)
			n := b.name("c")
			t := time.Now()
			if _, err := c.m.Create(ctx, sandbox.CreateOptions{Name: n, Dir: b.project}); err != nil {
				return err
			}
			if err := first(ctx, c.m, n); err != nil {
				return err
			}
			s = append(s, time.Since(t))
			if err := c.m.Remove(ctx, n); err != nil {
				return err
			}
		}
		rep.add(sec, c.tool, "Create from a project dir, then `true` answered", s, "")
	}
	peers := []struct {
		tool, what string
		argv       []string
	}{
		{"bwrap", "bwrap --unshare-all --ro-bind / / true (no writable root)", []string{"bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"}},
		{"bwrap +proc+dev", "bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp true", []string{"bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true"}},
		{"unshare", "unshare -mpfnuiC --mount-proc true", []string{"unshare", "-m", "-p", "-f", "-n", "-u", "-i", "-C", "--mount-proc", "true"}},
		{"podman", "podman run --rm --network none debian true", []string{"podman", "run", "--rm", "--network", "none", "debian", "true"}},
	}
	for _, p := range peers {
		if _, err := exec.LookPath(p.argv[0]); err != nil {
			rep.skipped = append(rep.skipped, fmt.Sprintf("%s: %s is not installed", p.tool, p.argv[0]))
			continue
		}
		s, err := timeCmd(ctx, b.o.reps, p.argv...)
		if err != nil {
			rep.skipped = append(rep.skipped, fmt.Sprintf("%s: does not run here: %v", p.tool, err))
			continue
		}
		rep.add(sec, p.tool, p.what, s, "")
	}
	return nil
}

// fsPart: the file system part of a create, a cowfs branch served from a
// pooled mount and its first stat, beside git worktree add.
func (b *bench) fsPart(ctx context.Context, rep *report) error {
	const sec = "fs part"
	snap, err := b.fs.Import(ctx, b.project, "")
	if err != nil {
		return err
	}
	pool, err := b.fs.NewMountPool(ctx, filepath.Join(b.base, "fsmounts"), 4, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	var s, g []time.Duration
	for i := 0; i < b.o.reps; i++ {
		n := b.name("fs")
		time.Sleep(15 * time.Millisecond)
		t := time.Now()
		m, err := pool.Fork(ctx, snap, n)
		if err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(m.Dir(), "d1", "f1.txt")); err != nil {
			return err
		}
		s = append(s, time.Since(t))
		m.Unmount()
		b.fs.DeleteBranch(ctx, n)
		wt := filepath.Join(b.base, "wt-"+n)
		t = time.Now()
		if out, err := exec.Command("git", "-C", b.project, "worktree", "add", "-q", "--detach", wt).CombinedOutput(); err != nil {
			return fmt.Errorf("git worktree add: %v: %s", err, out)
		}
		if _, err := os.Stat(filepath.Join(wt, "d1", "f1.txt")); err != nil {
			return err
		}
		g = append(g, time.Since(t))
		exec.Command("git", "-C", b.project, "worktree", "remove", "--force", wt).Run()
	}
	rep.add(sec, "tine", "cowfs branch + pooled mount + first stat (200 files)", s, "")
	rep.add(sec, "git worktree", "git worktree add --detach + first stat (200 files)", g, "")
	return nil
}

// exec: the round trip of `true` in a running sandbox, beside starting
// `true` on the host.
func (b *bench) exec(ctx context.Context, rep *report) error {
	const sec = "exec"
	n := b.name("e")
	if _, err := b.warm.Create(ctx, sandbox.CreateOptions{Name: n, Dir: b.project}); err != nil {
		return err
	}
	defer b.warm.Remove(ctx, n)
	var s []time.Duration
	for i := 0; i < b.o.execs; i++ {
		t := time.Now()
		if err := first(ctx, b.warm, n); err != nil {
			return err
		}
		s = append(s, time.Since(t))
	}
	rep.add(sec, "tine", "Exec true in a running sandbox, to its exit status", s, "")
	h, err := timeCmd(ctx, b.o.execs, "true")
	if err != nil {
		return err
	}
	rep.add(sec, "host", "os/exec of true on the host (no sandbox)", h, "")
	bw, err := timeCmd(ctx, b.o.reps, "bwrap", "--unshare-all", "--ro-bind", "/", "/", "true")
	if err == nil {
		rep.add(sec, "bwrap", "a new bwrap per command (it has no exec into a running one)", bw, "")
	}
	return nil
}

// tickerPy sleeps 1 ms at a time and keeps the longest gap between two
// ticks, in ns, in /tmp/tine-gap (reset by /tmp/tine-gap-reset).
const tickerPy = `import os, time
last, mx = time.monotonic(), 0.0
while True:
    time.sleep(0.001)
    now = time.monotonic()
    gap, last = now - last, now
    if os.path.exists("/tmp/tine-gap-reset"):
        os.remove("/tmp/tine-gap-reset")
        mx = 0.0
    if gap > mx:
        mx = gap
        with open("/tmp/tine-gap.tmp", "w") as f:
            f.write("%d" % int(mx * 1e9))
        os.rename("/tmp/tine-gap.tmp", "/tmp/tine-gap")
`

// fuseTransport names how new project mounts reach their server.
func fuseTransport() string {
	if cowfs.URingOffered() {
		return "io_uring"
	}
	return "/dev/fuse"
}
