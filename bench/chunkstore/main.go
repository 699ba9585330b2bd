// Command chunkstore benchmarks tine's chunk store against restic and
// casync, side by side in one run, on the same data:
//
//	(a) the Go source tree, $(go env GOROOT)/src
//	(b) 1 GiB of pseudo-random data (one file)
//	(c) the tree again after deterministic edits to 1% of its files
//
// Every tool ingests (a) and then (c) into one repository, and (b) into
// another. Inputs are read once before timing so that all tools read from
// the page cache. restic runs with --no-cache on every backup.
//
// Usage: go run ./bench/chunkstore [-quick] [-rounds N] [-work DIR] [-src DIR]
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"tine/chunkstore"
)

func main() {
	quick := flag.Bool("quick", false, "small run: a subtree of the source and 128 MiB of random data")
	work := flag.String("work", filepath.Join(os.TempDir(), "tine-bench-chunkstore"), "scratch directory (removed first)")
	src := flag.String("src", "", "source tree for (a) and (c) (default $(go env GOROOT)/src, or its net/ subtree with -quick)")
	randMiB := flag.Int("random-mib", 1024, "size of the random data set (b) in MiB (-quick: 128)")
	keep := flag.Bool("keep", false, "keep the scratch directory")
	rounds := flag.Int("rounds", 3, "rounds to run; the table shows medians (-quick: 1)")
	only := flag.String("tools", "tine,restic,casync", "comma-separated tools to run")
	level := flag.Int("level", 0, "tine's zstd level (chunkstore.Options.Level; 0 = its default)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (tine's work) to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/chunkstore:", err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *quick && *rounds == 3 {
		*rounds = 1
	}
	if err := run(*quick, *work, *src, *randMiB, *rounds, *level, *keep, strings.Split(*only, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "bench/chunkstore:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

type result struct {
	tool, set string
	logical   int64
	dur       time.Duration
	cpu       time.Duration // user + system CPU time the tool used
	stored    int64         // repository size after this step (bytes on disk)
	added     int64         // growth of the repository in this step
	err       error
}

func (r result) mbps() float64 { return float64(r.logical) / 1e6 / r.dur.Seconds() }

func run(quick bool, work, src string, randMiB, rounds, level int, keep bool, only []string) error {
	if src == "" {
		src = filepath.Join(runtime.GOROOT(), "src")
		if quick {
			src = filepath.Join(src, "net")
		}
	}
	if quick && randMiB == 1024 {
		randMiB = 128
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(work)
	}
	treeA := filepath.Join(work, "data", "a", "src")
	treeC := filepath.Join(work, "data", "c", "src")
	randFile := filepath.Join(work, "data", "b", "random.bin")
	fmt.Printf("preparing data in %s\n", work)
	for _, d := range []string{treeA, treeC} {
		if err := copyTree(src, d); err != nil {
			return err
		}
	}
	edited, err := editTree(treeC)
	if err != nil {
		return err
	}
	if err := writeRandom(randFile, int64(randMiB)<<20); err != nil {
		return err
	}
	sizeA, filesA := treeSize(treeA)
	sizeC, _ := treeSize(treeC)
	sizeB, _ := treeSize(randFile)
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("machine: %d cores, load average %s", runtime.NumCPU(), load)
	fmt.Printf("(a) %s: %d files, %.1f MB; (b) %.1f MB random; (c) %d of %d files edited\n", src, filesA, float64(sizeA)/1e6, float64(sizeB)/1e6, edited, filesA)

	sets := []struct {
		name, repo, path string
		logical          int64
	}{
		{"a", "tree", treeA, sizeA},
		{"c", "tree", treeC, sizeC},
		{"b", "random", randFile, sizeB},
	}
	type tool struct {
		name string
		init func(repo string) error
		put  func(repo, set, path string) (cpu time.Duration, err error)
	}
	var tools []tool
	for _, t := range []tool{
		{"tine", func(string) error { return nil }, func(repo, set, path string) (time.Duration, error) {
			return tinePut(&chunkstore.Options{Level: level}, repo, set, path)
		}},
		{"restic", resticInit, resticPut},
		{"casync", func(repo string) error { return os.MkdirAll(repo, 0o755) }, casyncPut},
	} {
		if !slices.Contains(only, t.name) {
			continue
		}
		if t.name != "tine" {
			if _, err := exec.LookPath(t.name); err != nil {
				fmt.Printf("%s: not installed, skipped\n", t.name)
				continue
			}
		}
		tools = append(tools, t)
	}
	// Each round starts from empty repositories. Within a round the tools
	// take turns on each data set, in an order that rotates from round to
	// round, so that they meet the same machine load; the table shows each
	// one's median.
	var all [][]result
	for round := range rounds {
		repoDir := filepath.Join(work, "repo")
		if err := os.RemoveAll(repoDir); err != nil {
			return err
		}
		var results []result
		inited := map[string]bool{}
		for _, s := range sets {
			for i := range tools {
				t := tools[(i+round)%len(tools)]
				repo := filepath.Join(repoDir, t.name+"-"+s.repo)
				r := result{tool: t.name, set: s.name, logical: s.logical}
				if !inited[repo] {
					if r.err = t.init(repo); r.err != nil {
						results = append(results, r)
						continue
					}
					inited[repo] = true
				}
				before, _ := treeSize(repo)
				warm(s.path)
				start := time.Now()
				r.cpu, r.err = t.put(repo, s.name, s.path)
				r.dur = time.Since(start)
				r.stored, _ = treeSize(repo)
				r.added = r.stored - before
				results = append(results, r)
				if r.err != nil {
					fmt.Printf("round %d %-7s (%s): error: %v\n", round+1, t.name, s.name, r.err)
				} else {
					fmt.Printf("round %d %-7s (%s): %6.1f MB/s, %.2fs (CPU %.2fs), repository %.1f MB (+%.1f MB)\n", round+1, t.name, s.name, r.mbps(), r.dur.Seconds(), r.cpu.Seconds(), float64(r.stored)/1e6, float64(r.added)/1e6)
				}
			}
		}
		all = append(all, results)
	}
	printTable(os.Stdout, medians(all))
	load, _ = os.ReadFile("/proc/loadavg")
	fmt.Printf("\nload average at the end: %s", load)
	return nil
}

// medians returns, for each tool and set, the round with the median
// duration.
func medians(all [][]result) []result {
	var out []result
	for i := range all[0] {
		var rs []result
		for _, round := range all {
			for _, r := range round {
				if r.tool == all[0][i].tool && r.set == all[0][i].set && r.err == nil {
					rs = append(rs, r)
				}
			}
		}
		if len(rs) == 0 {
			out = append(out, all[0][i])
			continue
		}
		sort.Slice(rs, func(a, b int) bool { return rs[a].dur < rs[b].dur })
		out = append(out, rs[len(rs)/2])
	}
	return out
}

// printTable prints one row per data set and tool, with tine's ratio to
// each peer.
func printTable(w io.Writer, results []result) {
	get := func(tool, set string) *result {
		for i := range results {
			if results[i].tool == tool && results[i].set == set && results[i].err == nil {
				return &results[i]
			}
		}
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "set\ttool\tMB/s\tseconds\tCPU s\trepo MB\tadded MB\tdedup (c)\ttine/peer MB/s\ttine/peer CPU\ttine/peer repo\t")
	for _, set := range []string{"a", "b", "c"} {
		tine := get("tine", set)
		for _, tool := range []string{"tine", "restic", "casync"} {
			r := get(tool, set)
			if r == nil {
				continue
			}
			dedup, speed, cpu, size := "", "", "", ""
			if set == "c" && r.added > 0 {
				dedup = fmt.Sprintf("%.1fx", float64(r.logical)/float64(r.added))
			}
			if tool != "tine" && tine != nil {
				speed = fmt.Sprintf("%.2f", tine.mbps()/r.mbps())
				cpu = fmt.Sprintf("%.2f", tine.cpu.Seconds()/r.cpu.Seconds())
				size = fmt.Sprintf("%.2f", float64(tine.stored)/float64(r.stored))
			}
			fmt.Fprintf(tw, "(%s)\t%s\t%.1f\t%.2f\t%.2f\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t\n", set, tool, r.mbps(), r.dur.Seconds(), r.cpu.Seconds(), float64(r.stored)/1e6, float64(r.added)/1e6, dedup, speed, cpu, size)
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "\nrepo MB: the repository's size on disk after the step ((c) goes into the same repository as (a));")
	fmt.Fprintln(w, "dedup (c): bytes of (c) / bytes (c) added to the repository.")
	fmt.Fprintln(w, "CPU s: user + system CPU time of the tool (for tine, of this process during the step).")
}

// tinePut ingests a file or tree into the store at repo: files in
// parallel (one goroutine per core, each file cut with FastCDC and its
// chunks hashed and compressed), a node per file and directory, and a ref
// to the root. Timing includes opening and closing (the final fsyncs).
func tinePut(opts *chunkstore.Options, repo, set, path string) (time.Duration, error) {
	start := selfCPU()
	err := tineIngest(opts, repo, set, path)
	return selfCPU() - start, err
}

// selfCPU returns the user and system CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func tineIngest(opts *chunkstore.Options, repo, set, path string) error {
	s, err := chunkstore.Open(repo, opts)
	if err != nil {
		return err
	}
	root, err := ingest(context.Background(), s, path)
	if err == nil {
		err = s.SetRef("bench/"+set, chunkstore.ID{}, root)
	}
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	return err
}

func ingest(ctx context.Context, s *chunkstore.Store, root string) (chunkstore.ID, error) {
	if st, err := os.Stat(root); err != nil {
		return chunkstore.ID{}, err
	} else if st.Mode().IsRegular() {
		refs, err := putFile(ctx, s, root)
		if err != nil {
			return chunkstore.ID{}, err
		}
		links, payload := fileEntry(nil, nil, "", refs)
		return s.PutNode(links, payload)
	}
	type file struct {
		path string
		refs []chunkstore.Ref
		err  error
	}
	var files []*file
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		} else if d.Type().IsRegular() {
			files = append(files, &file{path: p})
		}
		return nil
	})
	if err != nil {
		return chunkstore.ID{}, err
	}
	jobs := make(chan *file)
	var wg sync.WaitGroup
	for range 2 * runtime.GOMAXPROCS(0) { // twice the cores: opens and reads block
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range jobs {
				f.refs, f.err = putFile(ctx, s, f.path)
			}
		}()
	}
	for _, f := range files {
		jobs <- f
	}
	close(jobs)
	wg.Wait()
	// One node per directory, deepest first, as restic and git keep one
	// tree per directory: its links are the chunks of its files and the
	// nodes of its subdirectories; its payload names them and gives sizes.
	type entry struct {
		name string
		refs []chunkstore.Ref // file
		dir  chunkstore.ID    // directory
	}
	entries := map[string][]entry{}
	for _, f := range files {
		if f.err != nil {
			return chunkstore.ID{}, f.err
		}
		d := filepath.Dir(f.path)
		entries[d] = append(entries[d], entry{name: filepath.Base(f.path), refs: f.refs})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	var rootID chunkstore.ID
	for _, d := range dirs {
		es := entries[d]
		sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
		var links []chunkstore.ID
		var payload []byte
		for _, e := range es {
			if e.refs == nil && !e.dir.IsZero() {
				links = append(links, e.dir)
				payload = append(append(payload, 'd'), e.name...)
				payload = append(payload, 0)
				continue
			}
			links, payload = fileEntry(links, payload, e.name, e.refs)
		}
		id, err := s.PutNode(links, payload)
		if err != nil {
			return chunkstore.ID{}, err
		}
		if d == root {
			rootID = id
			break
		}
		p := filepath.Dir(d)
		entries[p] = append(entries[p], entry{name: filepath.Base(d), dir: id})
	}
	return rootID, nil
}

// fileEntry appends a file's chunks to links and its name and chunk sizes
// to payload.
func fileEntry(links []chunkstore.ID, payload []byte, name string, refs []chunkstore.Ref) ([]chunkstore.ID, []byte) {
	payload = append(append(payload, 'f'), name...)
	payload = append(payload, 0)
	payload = binary.AppendUvarint(payload, uint64(len(refs)))
	for _, r := range refs {
		links = append(links, r.ID)
		payload = binary.AppendUvarint(payload, uint64(r.Size))
	}
	return links, payload
}

func putFile(ctx context.Context, s *chunkstore.Store, path string) ([]chunkstore.Ref, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	refs, err := s.PutStream(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if refs == nil {
		refs = []chunkstore.Ref{}
	}
	return refs, nil
}

func resticEnv(repo string) []string {
	return append(os.Environ(), "RESTIC_REPOSITORY="+repo, "RESTIC_PASSWORD=tine-bench")
}

func resticInit(repo string) error {
	_, err := runCmd(resticEnv(repo), "restic", "init", "--no-cache", "-q")
	return err
}

func resticPut(repo, set, path string) (time.Duration, error) {
	return runCmd(resticEnv(repo), "restic", "backup", "--no-cache", "-q", path)
}

func casyncPut(repo, set, path string) (time.Duration, error) {
	idx := filepath.Join(filepath.Dir(repo), filepath.Base(repo)+"-"+set+".caidx")
	if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
		idx = strings.TrimSuffix(idx, ".caidx") + ".caibx"
	}
	return runCmd(nil, "casync", "make", "--store="+repo, idx, path)
}

// runCmd runs a command and returns the CPU time it used.
func runCmd(env []string, name string, args ...string) (time.Duration, error) {
	cmd := exec.Command(name, args...)
	if env != nil {
		cmd.Env = env
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// copyTree copies the regular files and directories of src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
}

// editTree edits every 100th file (in sorted path order): a line is
// inserted in the middle and the last byte changed. It returns the count.
func editTree(root string) (int, error) {
	var paths []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			paths = append(paths, p)
		}
		return nil
	})
	sort.Strings(paths)
	n := 0
	for i := 0; i < len(paths); i += 100 {
		b, err := os.ReadFile(paths[i])
		if err != nil {
			return n, err
		}
		mid := len(b) / 2
		if j := bytes.IndexByte(b[mid:], '\n'); j >= 0 {
			mid += j + 1
		}
		out := append(append(append([]byte{}, b[:mid]...), []byte("// edited for the benchmark\n")...), b[mid:]...)
		if len(out) > 0 {
			out[len(out)-1] ^= 0x20
		}
		if err := os.WriteFile(paths[i], out, 0o644); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// writeRandom writes size bytes of SplitMix64 output (seed 1).
func writeRandom(path string, size int64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 4<<20)
	state := uint64(1)
	for written := int64(0); written < size; {
		for i := 0; i+8 <= len(buf); i += 8 {
			state += 0x9e3779b97f4a7c15
			z := state
			z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
			z = (z ^ (z >> 27)) * 0x94d049bb133111eb
			binary.LittleEndian.PutUint64(buf[i:], z^(z>>31))
		}
		n := min(int64(len(buf)), size-written)
		if _, err := f.Write(buf[:n]); err != nil {
			f.Close()
			return err
		}
		written += n
	}
	return f.Close()
}

// treeSize returns the bytes of the regular files under path and their count.
func treeSize(path string) (int64, int) {
	var total int64
	n := 0
	filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
				n++
			}
		}
		return nil
	})
	return total, n
}

// warm reads every file under path so that all tools read from the page cache.
func warm(path string) {
	filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if f, err := os.Open(p); err == nil {
				io.Copy(io.Discard, f)
				f.Close()
			}
		}
		return nil
	})
}
