// Command fsprof profiles one workload on a cowfs mount: it imports a
// directory (or starts empty), mounts a branch of it, runs a shell
// command in the mount, and reports the FUSE requests the kernel sent
// (from the fuse_request_send/fuse_request_end tracepoints, filtered to
// this mount's connection) by opcode with their count and time, plus a
// CPU profile of the server (pprof). It needs root and tracefs.
//
//	go run ./bench/fsprof [--src DIR] [--cpuprofile FILE] [--mutexprofile FILE] [--timeout 1s] [--no-keep-cache] [--writeback] -- 'tar -xf /x.tar -C "$MNT"'
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"tine/cowfs"
)

const tracing = "/sys/kernel/tracing"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fsprof:", err)
		os.Exit(1)
	}
}

func run() error {
	src := flag.String("src", "", "directory to import as the branch's starting tree (default: empty)")
	cpu := flag.String("cpuprofile", "", "write a CPU profile of the server to this file")
	mutex := flag.String("mutexprofile", "", "write a profile of the server's lock contention to this file (who held the locks others waited for)")
	timeout := flag.Duration("timeout", 0, "kernel cache timeout (cowfs.MountOptions.Timeout; 0: the default)")
	noKeep := flag.Bool("no-keep-cache", false, "cowfs.MountOptions.NoKeepCache")
	writeback := flag.Bool("writeback", false, "cowfs.MountOptions.Writeback")
	noURing := flag.Bool("no-uring", false, "cowfs.MountOptions.NoURing")
	setup := flag.String("setup", "", "shell command run in the mount before the measured one (untimed, not traced)")
	dir := flag.String("dir", "/var/tmp", "where the state and the mount go")
	flag.Parse()
	if flag.NArg() != 1 {
		return errors.New("want one shell command to run in the mount ($MNT names it)")
	}
	ctx := context.Background()
	work, err := os.MkdirTemp(*dir, "tine-fsprof-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	f, err := cowfs.Open(filepath.Join(work, "state"), nil)
	if err != nil {
		return err
	}
	defer f.Close()
	if *src == "" {
		*src = filepath.Join(work, "empty")
		if err := os.Mkdir(*src, 0o755); err != nil {
			return err
		}
	}
	snap, err := f.Import(ctx, *src, "")
	if err != nil {
		return err
	}
	if err := f.Branch(ctx, snap, "prof"); err != nil {
		return err
	}
	mnt := filepath.Join(work, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	m, err := f.Mount(ctx, "prof", mnt, &cowfs.MountOptions{Timeout: *timeout, NoKeepCache: *noKeep, Writeback: *writeback, NoURing: *noURing})
	if err != nil {
		return err
	}
	defer m.Unmount()
	sh := func(cmd string) error {
		c := exec.Command("sh", "-c", cmd)
		c.Env = append(os.Environ(), "MNT="+mnt)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		return c.Run()
	}
	if *setup != "" {
		if err := sh(*setup); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return err
	}
	conn := uint64(st.Dev)
	if err := startTrace(conn); err != nil {
		return err
	}
	if *cpu != "" {
		pf, err := os.Create(*cpu)
		if err != nil {
			return err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
	}
	if *mutex != "" {
		runtime.SetMutexProfileFraction(1)
	}
	t0 := time.Now()
	cerr := sh(flag.Arg(0))
	el := time.Since(t0)
	if *cpu != "" {
		pprof.StopCPUProfile()
	}
	if *mutex != "" {
		if err := writeProfile("mutex", *mutex); err != nil {
			return err
		}
	}
	stats, terr := stopTrace()
	fmt.Printf("command took %s over %s (exit: %v)\n", el.Round(time.Microsecond), m.Transport(), cerr)
	if terr != nil {
		return terr
	}
	printStats(stats)
	return cerr
}

func writeTrace(name, v string) error {
	return os.WriteFile(filepath.Join(tracing, name), []byte(v), 0o644)
}

func startTrace(conn uint64) error {
	if _, err := os.Stat(filepath.Join(tracing, "events", "fuse")); err != nil {
		return fmt.Errorf("fuse tracepoints: %w (mount tracefs: mount -t tracefs nodev %s)", err, tracing)
	}
	filter := fmt.Sprintf("connection == %d", conn)
	for _, step := range [][2]string{
		{"tracing_on", "0"}, {"trace", ""}, {"buffer_size_kb", "131072"},
		{"events/fuse/fuse_request_send/filter", filter}, {"events/fuse/fuse_request_end/filter", filter},
		{"events/fuse/enable", "1"}, {"tracing_on", "1"},
	} {
		if err := writeTrace(step[0], step[1]); err != nil {
			return fmt.Errorf("tracefs %s: %w", step[0], err)
		}
	}
	return nil
}

// opStat is the requests of one opcode.
type opStat struct {
	name  string
	count int
	total float64 // seconds between send and end
}

func stopTrace() (map[string]*opStat, error) {
	writeTrace("tracing_on", "0")
	defer func() {
		writeTrace("events/fuse/enable", "0")
		writeTrace("events/fuse/fuse_request_send/filter", "0")
		writeTrace("events/fuse/fuse_request_end/filter", "0")
		writeTrace("trace", "")
	}()
	fh, err := os.Open(filepath.Join(tracing, "trace"))
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	type pending struct {
		op string
		t  float64
	}
	inflight := map[string]pending{}
	stats := map[string]*opStat{}
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		// "... 1234.567890: fuse_request_send: connection 58 req 12 opcode 1 (FUSE_LOOKUP) len 45"
		i := strings.Index(line, ": fuse_request_")
		if i < 0 {
			continue
		}
		head := strings.Fields(line[:i])
		if len(head) == 0 {
			continue
		}
		ts, err := strconv.ParseFloat(head[len(head)-1], 64)
		if err != nil {
			continue
		}
		f := strings.Fields(line[i+2:])
		req := field(f, "req")
		switch f[0] {
		case "fuse_request_send:":
			op := ""
			for _, w := range f {
				if strings.HasPrefix(w, "(FUSE_") {
					op = strings.Trim(w, "()")
				}
			}
			inflight[req] = pending{op, ts}
		case "fuse_request_end:":
			p, ok := inflight[req]
			if !ok {
				continue
			}
			delete(inflight, req)
			s := stats[p.op]
			if s == nil {
				s = &opStat{name: p.op}
				stats[p.op] = s
			}
			s.count++
			s.total += ts - p.t
		}
	}
	return stats, sc.Err()
}

func field(f []string, key string) string {
	for i := 0; i+1 < len(f); i++ {
		if f[i] == key {
			return f[i+1]
		}
	}
	return ""
}

func printStats(stats map[string]*opStat) {
	var list []*opStat
	n, total := 0, 0.0
	for _, s := range stats {
		list = append(list, s)
		n += s.count
		total += s.total
	}
	sort.Slice(list, func(i, j int) bool { return list[i].total > list[j].total })
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "opcode\trequests\ttotal ms\tmean µs\t")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t\n", s.name, s.count, s.total*1e3, s.total/float64(s.count)*1e6)
	}
	fmt.Fprintf(tw, "all\t%d\t%.1f\t\t\n", n, total*1e3)
	tw.Flush()
}

// writeProfile writes the named runtime profile to path.
func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
