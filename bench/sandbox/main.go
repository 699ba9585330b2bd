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
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"tine/bench/internal/hostload"
	"tine/cowfs"
	"tine/guestagent/client"
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
	dir     string
	only    map[string]bool // sections to run; nil runs all
}

func main() {
	ns.Init()
	quick := flag.Bool("quick", false, "fewer samples, fork fan-out up to 10, 20 alive")
	md := flag.String("md", "", "also write the results as Markdown to this file")
	save := flag.String("save", "", "also write the results as JSON to this file (bench/report --sandbox)")
	dir := flag.String("dir", "/var/tmp", "directory for the state, the project and the agent binary")
	only := flag.String("only", "", "run only these sections, comma-separated: create, breakdown, fs, exec, fork, bigfork, alive (the goals need create and fork)")
	fanout := flag.String("fanout", "", "fork fan-outs to measure, comma-separated (default 1,10,100; 1,10 with -quick)")
	forkReps := flag.Int("fork-reps", 0, "samples of each fork fan-out (0: the default for its size)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	uring := flag.Bool("fuse-uring", true, "serve project mounts over FUSE io_uring, as tine serve does (false: over /dev/fuse, to measure ADR 0181)")
	flag.Parse()
	o := options{reps: 30, execs: 300, fanouts: []int{1, 10, 100}, forkRep: map[int]int{1: 10, 10: 5, 100: 1}, alive: 100, dir: *dir}
	if *quick {
		o = options{reps: 8, execs: 50, fanouts: []int{1, 10}, forkRep: map[int]int{1: 3, 10: 2}, alive: 20, dir: *dir}
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

// row is one measured line: samples of one tool doing one thing.
type row struct {
	section, tool, what string
	samples             []time.Duration
	note                string
}

func (r row) pct(p float64) time.Duration {
	if len(r.samples) == 0 {
		return 0
	}
	s := slices.Clone(r.samples)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// report is a run's rows, notes and skipped peers.
type report struct {
	date    time.Time
	command string
	host    string
	// loadStart and loadEnd are /proc/loadavg's first three fields before
	// and after the run.
	loadStart, loadEnd string
	rows               []row
	notes              []string
	skipped            []string
	goals              []string
}

func (r *report) add(section, tool, what string, s []time.Duration, note string) {
	r.rows = append(r.rows, row{section, tool, what, s, note})
}

func (r *report) find(section, tool string) *row {
	for i := range r.rows {
		if r.rows[i].section == section && r.rows[i].tool == tool {
			return &r.rows[i]
		}
	}
	return nil
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 2, 64)
}

// table renders the rows: per section, each tool's p50 and p90 and the
// ratio of the section's first (tine) row's p50 to it (none in the
// breakdown, whose rows are steps, not peers).
func (r *report) table(md bool) string {
	var b strings.Builder
	sep := "  "
	if md {
		b.WriteString("| section | tool | what | n | p50 ms | p90 ms | tine/peer (p50) |\n|---|---|---|---|---|---|---|\n")
	}
	var first map[string]time.Duration = map[string]time.Duration{}
	for _, x := range r.rows {
		p50 := x.pct(0.5)
		ratio := ""
		f, ok := first[x.section]
		switch {
		case x.section == "breakdown":
		case ok && p50 > 0:
			ratio = fmt.Sprintf("%.3gx", float64(f)/float64(p50))
		case !ok:
			first[x.section] = p50
		}
		what := x.what
		if x.note != "" {
			what += " (" + x.note + ")"
		}
		if md {
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %s |\n", x.section, x.tool, what, len(x.samples), ms(p50), ms(x.pct(0.9)), ratio)
		} else {
			fmt.Fprintf(&b, "%-14s%s%-22s%s%-58s%s%4d%s%9s%s%9s%s%8s\n", x.section, sep, x.tool, sep, what, sep, len(x.samples), sep, ms(p50), sep, ms(x.pct(0.9)), sep, ratio)
		}
	}
	return b.String()
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "bench/sandbox %s on %s\n\n", r.date.Format(time.RFC3339), r.host)
	fmt.Fprintf(w, "%-14s  %-22s  %-58s  %4s  %9s  %9s  %8s\n", "section", "tool", "what", "n", "p50 ms", "p90 ms", "tine/x")
	io.WriteString(w, r.table(false))
	for _, n := range r.notes {
		fmt.Fprintln(w, "note:", n)
	}
	for _, s := range r.skipped {
		fmt.Fprintln(w, "skipped:", s)
	}
	for _, g := range r.goals {
		fmt.Fprintln(w, "goal:", g)
	}
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run of %s on %s (`go run ./bench/sandbox`).\n\n", r.date.Format("2006-01-02 15:04 MST"), r.host)
	b.WriteString(r.table(true))
	b.WriteString("\n")
	for _, g := range r.goals {
		fmt.Fprintf(&b, "- Goal: %s\n", g)
	}
	for _, n := range r.notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	for _, s := range r.skipped {
		fmt.Fprintf(&b, "- Skipped: %s\n", s)
	}
	return b.String()
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
	steps := []func(context.Context, *report) error{b.create, b.breakdown, b.fsPart, b.exec, b.fork, b.forkBig, b.alive}
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
var sections = []string{"create", "breakdown", "fs", "exec", "fork", "bigfork", "alive"}

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

// fork: Fork of a running sandbox into N, until every fork has answered
// its first command.
func (b *bench) fork(ctx context.Context, rep *report) error {
	parent := b.name("p")
	if _, err := b.warm.Create(ctx, sandbox.CreateOptions{Name: parent, Dir: b.project}); err != nil {
		return err
	}
	defer b.warm.Remove(ctx, parent)
	p, err := b.warm.Exec(ctx, parent, proto.ExecRequest{Argv: []string{"sh", "-c",
		"echo x > /etc/tine-bench; mkdir -p /root/.cache && head -c 1000000 /dev/urandom > /root/.cache/blob; sleep 100000 & true"}})
	if err != nil {
		return err
	}
	if _, err := p.Wait(ctx); err != nil {
		return err
	}
	for _, n := range b.o.fanouts {
		sec := fmt.Sprintf("fork x%d", n)
		var s []time.Duration
		warmKids := 0
		for i := 0; i < b.o.forkRep[n]; i++ {
			names := make([]string, n)
			for j := range names {
				names[j] = b.name("k")
			}
			// The pool refills between samples, as it would between
			// forks a while apart.
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			b.warmRT.WaitWarm(wctx, min(n, b.warmN))
			cancel()
			bound := b.warmRT.WarmBound()
			t := time.Now()
			kids, err := b.warm.Fork(ctx, parent, sandbox.ForkOptions{N: n, Names: names})
			if err != nil {
				return err
			}
			var wg sync.WaitGroup
			errs := make([]error, n)
			for j, k := range kids {
				wg.Add(1)
				go func() { defer wg.Done(); errs[j] = first(ctx, b.warm, k.Name) }()
			}
			wg.Wait()
			s = append(s, time.Since(t))
			warmKids = b.warmRT.WarmBound() - bound
			for _, k := range kids {
				b.warm.Remove(ctx, k.Name)
			}
			for _, e := range errs {
				if e != nil {
					return e
				}
			}
		}
		rep.add(sec, "tine", fmt.Sprintf("Fork into %d (1 MB OS layer), all answered `true`; %d from warm sandboxes", n, warmKids), s, "")
		bw, err := timeCmd(ctx, max(1, b.o.forkRep[n]), "sh", "-c", fmt.Sprintf(
			"for i in $(seq %d); do bwrap --unshare-all --ro-bind / / true & done; wait", n))
		if err == nil {
			rep.add(sec, "bwrap", fmt.Sprintf("%d bwrap true at once (no state to copy)", n), bw, "")
		}
	}
	return nil
}

// forkBig: fork into 1 of a sandbox that wrote 64 MB in 2,000 files
// outside its project (a package install's size), every file changed
// since its last snapshot (the snapshot copies them all) or 20 of them
// (it links the rest: ADR 0207), beside a durable cp -a of that OS
// layer: the copy a snapshot made before, and, before ADR 0206, each of
// its forks too.
func (b *bench) forkBig(ctx context.Context, rep *report) error {
	parent := b.name("big")
	if _, err := b.warm.Create(ctx, sandbox.CreateOptions{Name: parent, Dir: b.project}); err != nil {
		return err
	}
	defer b.warm.Remove(ctx, parent)
	run := func(what, script string) error {
		p, err := b.warm.Exec(ctx, parent, proto.ExecRequest{Argv: []string{"sh", "-c", script}})
		if err != nil {
			return err
		}
		if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 {
			return fmt.Errorf("%s in %s: %v (exit %d)", what, parent, err, ex.Code)
		}
		return nil
	}
	if err := run("fill the OS layer", "mkdir -p /opt/tine-bench && cd /opt/tine-bench && for d in $(seq 20); do mkdir $d; for f in $(seq 100); do printf '%032768d' $f > $d/$f; done; done; sleep 100000 & true"); err != nil {
		return err
	}
	// A process in the parent ticks every millisecond; its longest gap
	// during a fork is how long the fork paused the parent's processes
	// (the freeze of its snapshot).
	ticking := run("start a ticker", "command -v python3 >/dev/null && { python3 -c '"+tickerPy+"' >/dev/null 2>&1 & }") == nil
	// forks times forks into 1, each after the parent ran change: its
	// snapshot copies what changed since the last one and links the rest
	// (ADR 0207).
	forks := func(change string) (s, pause []time.Duration, err error) {
		for i := 0; i < b.o.forkRep[1]; i++ {
			if err := run("change the OS layer", change); err != nil {
				return nil, nil, err
			}
			// Past the racy window of a snapshot's copy (ADR 0207), as
			// changes a moment before a fork are.
			time.Sleep(100 * time.Millisecond)
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			b.warmRT.WaitWarm(wctx, 1)
			cancel()
			if ticking {
				if err := run("reset the ticker", "touch /tmp/tine-gap-reset; sleep 0.02"); err != nil {
					return nil, nil, err
				}
			}
			kid := b.name("k")
			t := time.Now()
			if _, err := b.warm.Fork(ctx, parent, sandbox.ForkOptions{N: 1, Names: []string{kid}}); err != nil {
				return nil, nil, err
			}
			err := first(ctx, b.warm, kid)
			s = append(s, time.Since(t))
			b.warm.Remove(ctx, kid)
			if err != nil {
				return nil, nil, err
			}
			if ticking {
				out, err := output(ctx, b.warm, parent, "cat /tmp/tine-gap")
				ns, perr := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
				if err != nil || perr != nil {
					return nil, nil, fmt.Errorf("read the ticker's gap in %s: %v %v (%q)", parent, err, perr, out)
				}
				pause = append(pause, time.Duration(ns))
			}
		}
		return s, pause, nil
	}
	all, allPause, err := forks("find /opt/tine-bench -type f -exec touch {} +")
	if err != nil {
		return err
	}
	some, somePause, err := forks("cd /opt/tine-bench/7 && for f in $(seq 20); do printf '%032768d' $RANDOM > $f; done")
	if err != nil {
		return err
	}
	upper := filepath.Join(b.base, "state-warm", "sandboxes", parent, "runtime", "upper")
	var cp []time.Duration
	for i := 0; i < b.o.forkRep[1]; i++ {
		dst := filepath.Join(b.base, "cp-layer")
		t := time.Now()
		out, err := exec.CommandContext(ctx, "sh", "-c", `cp -a --reflink=auto "$1" "$2" && sync -f "$2"`, "sh", upper, dst).CombinedOutput()
		cp = append(cp, time.Since(t))
		os.RemoveAll(dst)
		if err != nil {
			return fmt.Errorf("cp -a %s: %v: %s", upper, err, out)
		}
	}
	const layer = "Fork into 1 of a sandbox whose OS layer holds 64 MB in 2,000 files"
	const peer = "cp -a of that OS layer, written out: the durable copy each fork's snapshot made before"
	rep.add("fork x1, big OS layer", "tine", layer+", every file changed since its last snapshot, answered `true`", all, "")
	rep.add("fork x1, big OS layer", "cp -a + syncfs", peer, cp, "")
	rep.add("fork x1, big OS layer, 20 files changed", "tine", layer+", 20 of them rewritten since its last snapshot, answered `true`", some, "")
	rep.add("fork x1, big OS layer, 20 files changed", "cp -a + syncfs", peer, cp, "")
	if ticking {
		const what = "longest pause of a process in the parent ticking every 1 ms, during that fork"
		rep.add("fork x1, big OS layer: parent's pause", "tine", what+" (every file changed)", allPause, "")
		rep.add("fork x1, big OS layer, 20 files changed: parent's pause", "tine", what, somePause, "")
	} else {
		rep.skipped = append(rep.skipped, "the parent's pause during a fork: python3 is not installed")
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

// output runs script in sandbox name and returns what it printed.
func output(ctx context.Context, m *sandbox.Manager, name, script string) (string, error) {
	p, err := m.Exec(ctx, name, proto.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err != nil {
		return "", err
	}
	out, _ := io.ReadAll(p.Stdout)
	if ex, err := p.Wait(ctx); err != nil || ex.Code != 0 {
		return string(out), fmt.Errorf("%s in %s: %v (exit %d)", script, name, err, ex.Code)
	}
	return string(out), nil
}

// alive: n sandboxes running at once, each answering exec; memory per
// sandbox from MemAvailable and from the PSS of their processes.
func (b *bench) alive(ctx context.Context, rep *report) error {
	n := b.o.alive
	sec := fmt.Sprintf("%d alive", n)
	before := memAvailable()
	var names []string
	defer func() {
		for _, x := range names {
			b.warm.Remove(ctx, x)
		}
	}()
	t := time.Now()
	for i := 0; i < n; i++ {
		if i < b.warmN {
			b.warmRT.WaitWarm(ctx, b.warmN-i)
		}
		x := b.name("a")
		if _, err := b.warm.Create(ctx, sandbox.CreateOptions{Name: x, Dir: b.project}); err != nil {
			return fmt.Errorf("sandbox %d of %d: %w", i+1, n, err)
		}
		names = append(names, x)
	}
	createAll := time.Since(t)
	var s []time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, n)
	t = time.Now()
	for i, x := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			errs[i] = first(ctx, b.warm, x)
			mu.Lock()
			s = append(s, time.Since(t))
			mu.Unlock()
		}()
	}
	wg.Wait()
	all := time.Since(t)
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	time.Sleep(200 * time.Millisecond)
	after := memAvailable()
	pss := sandboxPSS()
	rep.add(sec, "tine", fmt.Sprintf("exec true in each of %d running sandboxes at once", n), s, "")
	rep.notes = append(rep.notes, fmt.Sprintf("%d alive: created one after another in %s ms; all %d answered within %s ms; "+
		"host memory used %.1f MiB per sandbox (MemAvailable), PSS of the sandboxes' processes %.1f MiB per sandbox",
		n, ms(createAll), n, ms(all), float64(before-after)/float64(n)/(1<<20), float64(pss)/float64(n)/(1<<20)))
	return nil
}

// memAvailable reads MemAvailable in bytes.
func memAvailable() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v << 10
		}
	}
	return 0
}

// sandboxPSS sums the PSS of every process named tine-agent.
func sandboxPSS() int64 {
	var sum int64
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		c, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if strings.TrimSpace(string(c)) != "tine-agent" {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "smaps_rollup"))
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				sum += v << 10
			}
		}
	}
	return sum
}

// breakdown times the steps of a create and a fork one by one, through
// the same packages the manager uses.
func (b *bench) breakdown(ctx context.Context, rep *report) error {
	const sec = "breakdown"
	reps := b.o.reps
	snap, err := b.fs.Import(ctx, b.project, "")
	if err != nil {
		return err
	}
	pool, err := b.fs.NewMountPool(ctx, filepath.Join(b.base, "bdmounts"), 2, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	rt, err := ns.New(b.agent)
	if err != nil {
		return err
	}
	wdir := filepath.Join(b.base, "bd")
	w, err := rt.Warm(ctx, sandbox.WarmOptions{Dir: filepath.Join(wdir, "warm"), N: 1})
	if err != nil {
		return err
	}
	defer w.Close()
	var imp, walk, br, mnt, cold, coldAgent, warm, warmAgent, wfork, wforkAgent, ex, meta, cp, frz []time.Duration
	since := func(s *[]time.Duration, t time.Time) { *s = append(*s, time.Since(t)) }
	for i := 0; i < reps; i++ {
		t := time.Now()
		if _, err := b.fs.Import(ctx, b.project, ""); err != nil {
			return err
		}
		since(&imp, t)
		// One file changed: the import walks, the index finds the rest.
		if err := os.WriteFile(filepath.Join(b.project, "CHANGED"), []byte(strconv.Itoa(i)), 0o644); err != nil {
			return err
		}
		t = time.Now()
		if _, err := b.fs.Import(ctx, b.project, ""); err != nil {
			return err
		}
		since(&walk, t)
		n := b.name("bd")
		time.Sleep(15 * time.Millisecond)
		t = time.Now()
		if err := b.fs.BranchManyDeferred(ctx, snap, []string{n}); err != nil {
			return err
		}
		since(&br, t)
		t = time.Now()
		m, err := pool.Mount(ctx, n)
		if err != nil {
			return err
		}
		since(&mnt, t)
		// cold: re-executed init step, root, agent start
		spec := sandbox.Spec{ID: "tine-bd-" + n, Hostname: n, Dir: filepath.Join(wdir, n), ProjectPath: b.project, ProjectSource: m.Dir(), Hide: []string{b.base}}
		t = time.Now()
		in, err := b.coldRT.Start(ctx, spec)
		if err != nil {
			return err
		}
		since(&cold, t)
		c, err := client.Dial(ctx, in.AgentSocket())
		if err != nil {
			return err
		}
		since(&coldAgent, t)
		t = time.Now()
		if err := runTrue(ctx, c); err != nil {
			return err
		}
		since(&ex, t)
		c.Close()
		in.Stop(ctx)
		// snapshot copy of the upper layer and a freeze/thaw
		t = time.Now()
		if err := rt.CopyState(ctx, spec.Dir, spec.Dir+".copy"); err != nil {
			return err
		}
		since(&cp, t)
		// warm: bind
		if err := rt.WaitWarm(ctx, 1); err != nil {
			return err
		}
		time.Sleep(60 * time.Millisecond)
		spec.Dir, spec.ID = spec.Dir+".w", spec.ID+"w"
		t = time.Now()
		in, err = rt.Start(ctx, spec)
		if err != nil {
			return err
		}
		since(&warm, t)
		if c, err = client.Dial(ctx, in.AgentSocket()); err != nil {
			return err
		}
		since(&warmAgent, t)
		t = time.Now()
		if err := in.Freeze(ctx); err != nil {
			return err
		}
		if err := in.Thaw(ctx); err != nil {
			return err
		}
		since(&frz, t)
		c.Close()
		in.Stop(ctx)
		// warm fork: bind with the root rebuilt over a copy of a layer
		if err := rt.WaitWarm(ctx, 1); err != nil {
			return err
		}
		time.Sleep(60 * time.Millisecond)
		fspec := spec
		fspec.Dir, fspec.ID, fspec.Seed = spec.Dir+"f", spec.ID+"f", strings.TrimSuffix(spec.Dir, ".w")+".copy"
		t = time.Now()
		in, err = rt.Start(ctx, fspec)
		if err != nil {
			return err
		}
		since(&wfork, t)
		if c, err = client.Dial(ctx, in.AgentSocket()); err != nil {
			return err
		}
		since(&wforkAgent, t)
		c.Close()
		in.Stop(ctx)
		m.Unmount()
		b.fs.DeleteBranch(ctx, n)
		t = time.Now()
		if err := writeSynced(filepath.Join(wdir, "meta.json"), []byte(`{"name":"x"}`)); err != nil {
			return err
		}
		since(&meta, t)
	}
	rep.add(sec, "cowfs", "Import of the project (200 files and its .git, 434 files in all; unchanged, watched)", imp, "")
	rep.add(sec, "cowfs", "Import of the same after one file changed (walk, the rest found by the index)", walk, "")
	rep.add(sec, "cowfs", "Branch, deferred as create makes it (no fdatasync; ADR 0190)", br, "")
	rep.add(sec, "cowfs", "pooled Mount of the branch", mnt, "")
	rep.add(sec, "ns cold", "Start: cgroups, clone, re-exec init, config sent", cold, "")
	rep.add(sec, "ns cold", "... + agent answered its handshake (root built, agent up)", coldAgent, "")
	rep.add(sec, "ns warm", "Start: bind a warm instance (rename, cgroup rename, project)", warm, "")
	rep.add(sec, "ns warm", "... + agent answered its handshake", warmAgent, "")
	rep.add(sec, "ns warm fork", "Start with a seed: its layer stacked (hard links), root rebuilt over it, pivot", wfork, "")
	rep.add(sec, "ns warm fork", "... + agent answered its handshake", wforkAgent, "")
	rep.add(sec, "agent", "Exec true round trip", ex, "")
	rep.add(sec, "metadata", "JSON write: temp file, fsync, rename, dir fsync", meta, "")
	rep.add(sec, "fork", "CopyState of an empty upper layer, as a snapshot copies (in process, reflinks)", cp, "")
	rep.add(sec, "fork", "freeze + thaw of a sandbox's cgroup", frz, "")
	return nil
}

func runTrue(ctx context.Context, c *client.Client) error {
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"true"}, Env: []string{"PATH=" + ns.DefaultPath}})
	if err != nil {
		return err
	}
	_, err = p.Wait(ctx)
	return err
}

func writeSynced(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	f.Write(data)
	f.Sync()
	f.Close()
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// goals states each goal of the issue as met or not, with the numbers.
func (b *bench) goals(rep *report) {
	sec := "create+first"
	if t, bw := rep.find(sec, "tine (warm)"), rep.find(sec, "bwrap"); t != nil {
		g := fmt.Sprintf("create → first command ≤ 5 ms p50: %s ms", ms(t.pct(0.5)))
		if bw != nil {
			g += fmt.Sprintf(" (bwrap %s ms, ratio %.2fx)", ms(bw.pct(0.5)), float64(t.pct(0.5))/float64(bw.pct(0.5)))
		}
		rep.goals = append(rep.goals, g+metOr(t.pct(0.5) <= 5*time.Millisecond))
	}
	if t := rep.find("fork x10", "tine"); t != nil {
		rep.goals = append(rep.goals, fmt.Sprintf("10 forks all answered ≤ 30 ms: %s ms p50", ms(t.pct(0.5)))+metOr(t.pct(0.5) <= 30*time.Millisecond))
	}
}

func metOr(ok bool) string {
	if ok {
		return ": met"
	}
	return ": not met"
}

// fuseTransport names how new project mounts reach their server.
func fuseTransport() string {
	if cowfs.URingOffered() {
		return "io_uring"
	}
	return "/dev/fuse"
}
