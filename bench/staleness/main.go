// Command staleness measures the two ways tine can tell how far a plain
// host directory moved since a sandbox was made from it, side by side on
// one synthetic tree: the metadata scan `tine status` runs (walk the
// directory and its imported snapshot together, compare stat results)
// and an inotify watch on every directory kept while the daemon runs. It
// reports setup cost, memory (user and kernel), the latency from a write
// to the watch knowing of it, the cost of answering "what changed", and
// what a burst of changes does to the watch's queue.
//
//	go run ./bench/staleness [-n 100000] [-changes 100] [-reps 5] [-dir DIR] [-json]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"tine/bench/internal/treegen"
	"tine/cowfs"
	"tine/sandbox"
)

// result is one run's numbers.
type result struct {
	Files, Dirs                  int
	GenerateS, ImportS           float64
	ScanCleanMs, ScanChangedMs   float64 // medians
	ScanAllocMB                  float64
	ScanFound                    int
	ScanPartialAtStatusBound     bool
	WatchSetupMs                 float64
	Watches                      int
	WatchUserMB, WatchKernelKB   float64
	LatencyP50Us, LatencyP99Us   float64
	WhatChangedUs                float64
	WatchFound                   int
	BurstFiles, BurstEvents      int
	BurstOverflow                bool
	BurstScanMs                  float64
	MaxUserWatches, MaxQueuedEvt int
}

func main() {
	n := flag.Int("n", 100_000, "files in the tree")
	changes := flag.Int("changes", 100, "files changed before asking what changed")
	reps := flag.Int("reps", 5, "samples of each scan")
	lat := flag.Int("latency", 200, "single changes timed for the watch's latency")
	burst := flag.Int("burst", 20_000, "files changed at once in the burst row")
	dir := flag.String("dir", "", "work directory (default: a new one under TMPDIR)")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Parse()
	if err := run(*n, *changes, *reps, *lat, *burst, *dir, *asJSON); err != nil {
		fmt.Fprintln(os.Stderr, "staleness:", err)
		os.Exit(1)
	}
}

func run(n, changes, reps, lat, burst int, dir string, asJSON bool) error {
	ctx := context.Background()
	if dir == "" {
		d, err := os.MkdirTemp("", "tine-bench-staleness-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	tree := filepath.Join(dir, "tree")
	r := result{Files: n, MaxUserWatches: readInt("/proc/sys/fs/inotify/max_user_watches"), MaxQueuedEvt: readInt("/proc/sys/fs/inotify/max_queued_events")}
	t0 := time.Now()
	if err := treegen.Generate(ctx, tree, n, 1, runtime.NumCPU()); err != nil {
		return err
	}
	r.GenerateS = time.Since(t0).Seconds()
	fs, err := cowfs.Open(filepath.Join(dir, "cowfs"), nil)
	if err != nil {
		return err
	}
	defer fs.Close()
	t0 = time.Now()
	base, err := fs.Import(ctx, tree, "")
	if err != nil {
		return err
	}
	r.ImportS = time.Since(t0).Seconds()
	progress := func(f string, a ...any) {
		if !asJSON {
			fmt.Fprintf(os.Stderr, f+"\n", a...)
		}
	}
	progress("tree of %d files generated in %.1fs, imported in %.1fs", n, r.GenerateS, r.ImportS)

	scan := func(max int) (sandbox.Staleness, time.Duration, uint64, error) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		a := ms.TotalAlloc
		t := time.Now()
		s, err := sandbox.ScanHost(ctx, fs, base, tree, max)
		d := time.Since(t)
		runtime.ReadMemStats(&ms)
		return s, d, ms.TotalAlloc - a, err
	}
	const unbounded = 1 << 40
	var clean []time.Duration
	for range reps {
		s, d, alloc, err := scan(unbounded)
		if err != nil {
			return err
		}
		if s.Changed+s.Added+s.Removed != 0 {
			return fmt.Errorf("clean scan found changes: %+v", s)
		}
		clean = append(clean, d)
		r.ScanAllocMB = float64(alloc) / (1 << 20)
	}
	r.ScanCleanMs = ms(median(clean))
	if s, _, _, _ := scan(sandbox.StaleMaxEntries); s.Partial {
		r.ScanPartialAtStatusBound = true
	}
	progress("scan, nothing changed: %.0f ms", r.ScanCleanMs)

	// The watch.
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	k0 := kernelMarks()
	t0 = time.Now()
	w, err := newWatcher(tree)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer w.close()
	r.WatchSetupMs = ms(time.Since(t0))
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	r.Watches, r.Dirs = len(w.dirs), len(w.dirs)
	r.WatchUserMB = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / (1 << 20)
	r.WatchKernelKB = float64(kernelMarks()-k0) / 1024
	progress("watch: %d directories in %.0f ms", r.Watches, r.WatchSetupMs)

	// Latency: one change at a time, from the write's start to the watch
	// recording its path.
	w.mu.Lock()
	w.seen = make(chan string, 64)
	w.mu.Unlock()
	var lats []time.Duration
	idx := treegen.Changed(n, lat)
	for j, i := range idx {
		p := treegen.Path(i)
		t := time.Now()
		if err := treegen.Modify(tree, []int{i}, "lat"+strconv.Itoa(j)); err != nil {
			return err
		}
		d, ok := w.waitFor(filepath.FromSlash(p), t, 5*time.Second)
		if !ok {
			return fmt.Errorf("the watch never saw %s change", p)
		}
		lats = append(lats, d)
	}
	w.mu.Lock()
	w.seen = nil
	w.mu.Unlock()
	sort.Slice(lats, func(a, b int) bool { return lats[a] < lats[b] })
	r.LatencyP50Us = us(lats[len(lats)/2])
	r.LatencyP99Us = us(lats[len(lats)*99/100])

	// What changed, both ways, after `changes` more files change (the
	// latency files changed too).
	if err := treegen.Modify(tree, treegen.Changed(n, changes), "c"); err != nil {
		return err
	}
	want := map[int]bool{}
	for _, i := range append(treegen.Changed(n, changes), idx...) {
		want[i] = true
	}
	time.Sleep(200 * time.Millisecond) // let the reader drain the queue
	var whats []time.Duration
	var got []string
	for range reps {
		t := time.Now()
		got, _ = w.what()
		whats = append(whats, time.Since(t))
	}
	r.WhatChangedUs, r.WatchFound = us(median(whats)), len(got)
	var changedScans []time.Duration
	for range reps {
		s, d, _, err := scan(unbounded)
		if err != nil {
			return err
		}
		changedScans = append(changedScans, d)
		r.ScanFound = s.Changed + s.Added + s.Removed
	}
	r.ScanChangedMs = ms(median(changedScans))
	if r.ScanFound != len(want) || r.WatchFound != len(want) {
		return fmt.Errorf("changed %d files; the scan found %d, the watch %d", len(want), r.ScanFound, r.WatchFound)
	}
	progress("what changed (%d files): scan %.0f ms, watch %.0f us", len(want), r.ScanChangedMs, r.WhatChangedUs)

	// A burst (a checkout, a build): does the queue keep up?
	w.reset()
	bidx := treegen.Changed(n, burst)
	if err := treegen.Modify(tree, bidx, "burst"); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	got, over := w.what()
	r.BurstFiles, r.BurstEvents, r.BurstOverflow = len(bidx), len(got), over
	_, d, _, err := scan(unbounded)
	if err != nil {
		return err
	}
	r.BurstScanMs = ms(d)

	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(r)
	}
	report(r)
	return nil
}

func report(r result) {
	fmt.Printf("staleness of a plain directory: %d files, %d directories\n\n", r.Files, r.Dirs)
	fmt.Printf("%-44s %18s %18s\n", "", "metadata scan", "inotify watch")
	row := func(name, a, b string) { fmt.Printf("%-44s %18s %18s\n", name, a, b) }
	row("setup (at sandbox create / daemon start)", "0 (import)", fmt.Sprintf("%.0f ms", r.WatchSetupMs))
	kernel := fmt.Sprintf("%.0f KiB kernel", r.WatchKernelKB)
	if r.WatchKernelKB == 0 {
		// The mark slab is merged with others; the kernel charges each
		// watch about 1 KiB (a mark and the inode it pins).
		kernel = fmt.Sprintf("~%d KiB kernel (est.)", r.Watches)
	}
	row("memory kept between questions", "0", fmt.Sprintf("%.2f MiB + %s", r.WatchUserMB, kernel))
	row("memory allocated per question", fmt.Sprintf("%.1f MiB", r.ScanAllocMB), "~0")
	row("watches (limit max_user_watches)", "-", fmt.Sprintf("%d (%d)", r.Watches, r.MaxUserWatches))
	row("latency, write to known (p50 / p99)", "at next question", fmt.Sprintf("%.0f / %.0f us", r.LatencyP50Us, r.LatencyP99Us))
	row("what changed, nothing changed", fmt.Sprintf("%.0f ms", r.ScanCleanMs), "-")
	row(fmt.Sprintf("what changed, %d files changed", r.ScanFound), fmt.Sprintf("%.0f ms", r.ScanChangedMs), fmt.Sprintf("%.0f us", r.WhatChangedUs))
	row(fmt.Sprintf("burst of %d changes", r.BurstFiles), fmt.Sprintf("%.0f ms", r.BurstScanMs), fmt.Sprintf("%d paths, overflow %v", r.BurstEvents, r.BurstOverflow))
	row("status's bound (entries) makes it partial", fmt.Sprint(r.ScanPartialAtStatusBound), "-")
	fmt.Printf("\ntree generated in %.1fs, imported in %.1fs; max_queued_events %d\n", r.GenerateS, r.ImportS, r.MaxQueuedEvt)
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func readInt(p string) int {
	b, _ := os.ReadFile(p)
	v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return v
}

// slabBytes returns active objects × object size of slab cache name.
func slabBytes(name string) int64 {
	f, err := os.Open("/proc/slabinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) > 3 && fl[0] == name {
			a, _ := strconv.ParseInt(fl[1], 10, 64)
			sz, _ := strconv.ParseInt(fl[3], 10, 64)
			return a * sz
		}
	}
	return 0
}
