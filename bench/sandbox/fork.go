package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"tine/guestagent/proto"
	"tine/sandbox"
)

// parent creates a warm sandbox named after prefix and runs script in it,
// which leaves its OS layer as the fork rows want it; the caller removes
// it.
func (b *bench) parent(ctx context.Context, prefix, script string) (string, error) {
	name := b.name(prefix)
	if _, err := b.warm.Create(ctx, sandbox.CreateOptions{Name: name, Dir: b.project}); err != nil {
		return "", err
	}
	p, err := b.warm.Exec(ctx, name, proto.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err == nil {
		var ex proto.Exit
		if ex, err = p.Wait(ctx); err == nil && ex.Code != 0 {
			err = fmt.Errorf("exit %d", ex.Code)
		}
	}
	if err != nil {
		b.warm.Remove(ctx, name)
		return "", fmt.Errorf("prepare %s (%s): %w", name, script, err)
	}
	return name, nil
}

// fork: Fork of a running sandbox into N, until every fork has answered
// its first command.
func (b *bench) fork(ctx context.Context, rep *report) error {
	parent, err := b.parent(ctx, "p", "echo x > /etc/tine-bench; mkdir -p /root/.cache && head -c 1000000 /dev/urandom > /root/.cache/blob; sleep 100000 & true")
	if err != nil {
		return err
	}
	defer b.warm.Remove(ctx, parent)
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
	parent, err := b.parent(ctx, "big", "mkdir -p /opt/tine-bench && cd /opt/tine-bench && for d in $(seq 20); do mkdir $d; for f in $(seq 100); do printf '%032768d' $f > $d/$f; done; done; sleep 100000 & true")
	if err != nil {
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
	// A process in the parent ticks every millisecond; its longest gap
	// during a fork is how long the fork paused the parent's processes
	// (the freeze of its snapshot).
	ticking := run("start a ticker", "command -v python3 >/dev/null && { python3 -c '"+tickerPy+"' >/dev/null 2>&1 & }") == nil
	// forks times forks into n, each after the parent ran change: its
	// snapshot copies what changed since the last one and links the rest
	// (ADR 0207), and its forks share one stacked layer (ADR 0215).
	forks := func(change string, n int) (s, pause []time.Duration, err error) {
		for i := 0; i < b.o.forkRep[1]; i++ {
			if err := run("change the OS layer", change); err != nil {
				return nil, nil, err
			}
			// Past the racy window of a snapshot's copy (ADR 0207), as
			// changes a moment before a fork are.
			time.Sleep(100 * time.Millisecond)
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			b.warmRT.WaitWarm(wctx, min(n, b.warmN))
			cancel()
			if ticking {
				if err := run("reset the ticker", "touch /tmp/tine-gap-reset; sleep 0.02"); err != nil {
					return nil, nil, err
				}
			}
			kids := make([]string, n)
			for j := range kids {
				kids[j] = b.name("k")
			}
			t := time.Now()
			if _, err := b.warm.Fork(ctx, parent, sandbox.ForkOptions{N: n, Names: kids}); err != nil {
				return nil, nil, err
			}
			errs := make([]error, n)
			var wg sync.WaitGroup
			for j, k := range kids {
				wg.Add(1)
				go func() { defer wg.Done(); errs[j] = first(ctx, b.warm, k) }()
			}
			wg.Wait()
			s = append(s, time.Since(t))
			for _, k := range kids {
				b.warm.Remove(ctx, k)
			}
			if err := errors.Join(errs...); err != nil {
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
	all, allPause, err := forks("find /opt/tine-bench -type f -exec touch {} +", 1)
	if err != nil {
		return err
	}
	const change20 = "cd /opt/tine-bench/7 && for f in $(seq 20); do printf '%032768d' $RANDOM > $f; done"
	some, somePause, err := forks(change20, 1)
	if err != nil {
		return err
	}
	some10, _, err := forks(change20, 10)
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
	rep.add("fork x10, big OS layer, 20 files changed", "tine", "Fork into 10 of that sandbox, 20 files rewritten since its last snapshot, all answered `true` (the forks share one stacked layer, ADR 0215)", some10, "")
	if bw, err := timeCmd(ctx, max(1, b.o.forkRep[1]), "sh", "-c", "for i in $(seq 10); do bwrap --unshare-all --ro-bind / / true & done; wait"); err == nil {
		rep.add("fork x10, big OS layer, 20 files changed", "bwrap", "10 bwrap true at once (no state to copy)", bw, "")
	}
	if ticking {
		const what = "longest pause of a process in the parent ticking every 1 ms, during that fork"
		rep.add("fork x1, big OS layer: parent's pause", "tine", what+" (every file changed)", allPause, "")
		rep.add("fork x1, big OS layer, 20 files changed: parent's pause", "tine", what, somePause, "")
	} else {
		rep.skipped = append(rep.skipped, "the parent's pause during a fork: python3 is not installed")
	}
	return nil
}

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
