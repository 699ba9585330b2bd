// Package fsbench benchmarks tine's copy-on-write filesystem against its
// peers side by side, in one run, on the same data: ext4 on a loop image,
// btrfs snapshots on a loop device, kernel overlayfs, fuse-overlayfs,
// cp -a, git and the host filesystem. It prints a table of medians with
// the ratio tine/peer, or JSON or CSV. It needs root (mounts, loop
// devices, drop_caches). bench/cowfs and `tine bench` run it.
package fsbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Tool names, as they appear in the tables.
const (
	toolTine        = "tine"
	toolTinePool    = "tine pool"
	toolBtrfs       = "btrfs"
	toolOverlay     = "overlayfs"
	toolFuseOverlay = "fuse-overlayfs"
	toolCp          = "cp -a"
	toolGit         = "git"
	toolNative      = "native"
)

// allTools is the column order of the tables.
var allTools = []string{toolTine, toolTinePool, toolTineDevFUSE, toolExt4, toolNative, toolBtrfs, toolOverlay, toolFuseOverlay, toolCp, toolGit}

// Section names for --only.
const (
	secSnapFork = "snapfork"
	secDiff     = "diff"
	secIO       = "io"
	secAgent    = "agent"
)

// config sizes one run.
type config struct {
	Mode        string
	TreeSizes   []int  // synthetic tree sizes for snapshot and fork
	GoTree      bool   // also snapshot and fork the Go source tree
	CopyMax     int    // cp -a and git snapshot/fork only trees up to this many files (0: all)
	DiffTree    int    // files in the tree diffs run on
	DiffChanges []int  // changed files per diff row; each divides the next
	BigFile     int64  // bytes of the sequential read/write file
	RandReads   int    // 4 KiB random reads per sample
	MetaFiles   int    // files created, stat'ed and unlinked
	UntarSubdir string // subdirectory of GOROOT/src to untar ("" = all of src)
	Untar       bool   // run the untar row
	GoBuild     bool   // run the go build row
	Reps        int    // samples of cheap measurements
	SlowReps    int    // samples of measurements that take seconds
	AgentFiles  int    // files of the agent section's project
	AgentReps   int    // repetitions of the agent loop
	Seed        uint64 // synthetic tree seed
	BtrfsBytes  int64  // size of the sparse btrfs image
	Sections    map[string]bool
	Tools       map[string]bool
	Dir         string // where temporary trees, images and mounts go
	Workers     int    // parallel writers for tree generation
	Log         io.Writer
	Progress    func(done, total int, what string) // nil: none
}

func modeConfig(mode string) (config, error) {
	c := config{Mode: mode, Seed: 1, Workers: 4, Log: os.Stderr}
	switch mode {
	case "full":
		c.TreeSizes = []int{1000, 10000, 100000}
		c.GoTree = true
		c.DiffTree, c.DiffChanges = 100000, []int{1, 100, 10000}
		c.BigFile, c.RandReads, c.MetaFiles = 1<<30, 8192, 50000
		c.Untar, c.GoBuild = true, true
		c.Reps, c.SlowReps = 7, 3
		c.AgentFiles, c.AgentReps = 10000, 5
		c.BtrfsBytes = 16 << 30
	case "quick":
		c.TreeSizes = []int{1000, 10000}
		c.CopyMax = 1000
		c.DiffTree, c.DiffChanges = 10000, []int{1, 100}
		c.BigFile, c.RandReads, c.MetaFiles = 256<<20, 2048, 5000
		c.Untar, c.UntarSubdir = true, "net"
		c.Reps, c.SlowReps = 5, 2
		c.AgentFiles, c.AgentReps = 10000, 3
		c.BtrfsBytes = 4 << 30
	case "tiny":
		c.TreeSizes = []int{200}
		c.DiffTree, c.DiffChanges = 200, []int{1, 10}
		c.BigFile, c.RandReads, c.MetaFiles = 4<<20, 64, 200
		c.Untar, c.UntarSubdir = true, "bufio"
		// The agent section builds with go on every filesystem; the data
		// section's go build row is left to the other modes.
		c.GoBuild = false
		c.Reps, c.SlowReps = 2, 1
		c.AgentFiles, c.AgentReps = 300, 1
		c.BtrfsBytes = 1 << 30
	default:
		return c, fmt.Errorf("unknown mode %q (full, quick, tiny)", mode)
	}
	return c, nil
}

// Options are what a caller outside the command line sets.
type Options struct {
	// Name is the command shown in the report (e.g. "go run ./bench/cowfs").
	Name string
	// Progress, when set, is called as the run advances: done of total
	// steps, and what runs now. Progress lines then go to it, not to stderr.
	Progress func(done, total int, what string)
}

// Main runs the benchmark with command-line args and returns the exit
// code: 0, 1 for a failure, 2 for a usage error.
func Main(args []string, stdout, stderr io.Writer, o Options) int {
	fl := flag.NewFlagSet("cowfs", flag.ContinueOnError)
	fl.SetOutput(stderr)
	quick := fl.Bool("quick", false, "smaller trees and fewer rows (about 2 minutes)")
	tiny := fl.Bool("tiny", false, "smallest sizes, one or two samples: checks that every row runs")
	asJSON := fl.Bool("json", false, "print the report as JSON instead of tables")
	reps := fl.Int("reps", 0, "repetitions of the agent loop (default: the mode's)")
	asCSV := fl.Bool("csv", false, "print the report as CSV (one line per row and tool) instead of tables")
	save := fl.String("save", "", "also write the report as JSON to this file")
	dir := fl.String("dir", "/var/tmp", "directory for temporary trees, images and mounts (its filesystem is the native peer)")
	only := fl.String("only", "", "comma-separated sections to run: snapfork, diff, io, agent (default all)")
	tools := fl.String("tools", "", "comma-separated tools to run (default all): "+strings.Join(allTools, ", "))
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	mode := "full"
	if *quick {
		mode = "quick"
	}
	if *tiny {
		mode = "tiny"
	}
	cfg, err := modeConfig(mode)
	if err != nil {
		fmt.Fprintln(stderr, "cowfs:", err)
		return 2
	}
	cfg.Dir = *dir
	if *reps > 0 {
		cfg.AgentReps = *reps
	}
	cfg.Progress = o.Progress
	if o.Progress != nil {
		cfg.Log = nil
	}
	if cfg.Sections, err = parseSet(*only, []string{secSnapFork, secDiff, secIO, secAgent}); err != nil {
		fmt.Fprintln(stderr, "cowfs: --only:", err)
		return 2
	}
	if cfg.Tools, err = parseSet(*tools, allTools); err != nil {
		fmt.Fprintln(stderr, "cowfs: --tools:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal, let a second one kill the process the
		// default way, in case cleanup itself hangs.
		<-ctx.Done()
		stop()
	}()
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = a
		if strings.ContainsAny(a, " \t'\"") {
			quoted[i] = strconv.Quote(a)
		}
	}
	name := o.Name
	if name == "" {
		name = "go run ./bench/cowfs"
	}
	rep, err := run(ctx, cfg, strings.TrimSpace(name+" "+strings.Join(quoted, " ")))
	if rep != nil {
		var werr error
		switch {
		case *asJSON:
			werr = writeJSON(stdout, rep)
		case *asCSV:
			werr = writeCSV(stdout, rep)
		default:
			werr = writeTable(stdout, rep)
		}
		if werr == nil && *save != "" {
			werr = saveJSON(*save, rep)
		}
		if werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "cowfs:", err)
		return 1
	}
	return 0
}

func saveJSON(path string, rep *report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("save report: %w", err)
	}
	err = writeJSON(f, rep)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("save report %s: %w", path, cerr)
	}
	return err
}

func parseSet(s string, valid []string) (map[string]bool, error) {
	set := map[string]bool{}
	if strings.TrimSpace(s) == "" {
		for _, v := range valid {
			set[v] = true
		}
		return set, nil
	}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		found := false
		for _, v := range valid {
			if v == f {
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown name %q (valid: %s)", f, strings.Join(valid, ", "))
		}
		set[f] = true
	}
	return set, nil
}

// step reports progress: done of total steps of the current section.
func (c *config) step(done, total int, what string) {
	if c.Progress != nil {
		c.Progress(done, total, what)
	}
}

// logf prints a progress line to cfg.Log.
func (c *config) logf(format string, a ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
}
