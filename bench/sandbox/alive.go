package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"tine/sandbox"
)

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
