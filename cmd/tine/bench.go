package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tine/bench/fsbench"
)

// benchCommand is `tine bench`: the measurements of the benchmark report
// (docs/bench/REPORT.md), one figure per command, so that a reader can
// reproduce it on their own machine.
func (a *app) benchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "bench",
		Short:   "measure tine against its peers on this machine (needs root)",
		GroupID: "host",
		Long: "bench runs the measurements of the benchmark report on this machine, with tine's peers\n" +
			"in the same run (ext4 on a loop image, btrfs, overlayfs, fuse-overlayfs, git, cp -a),\n" +
			"and prints medians with the ratio tine/peer. It needs root: it mounts filesystems,\n" +
			"attaches loop devices and drops the page cache.",
	}
	type spec struct {
		use, short, only, tools string
		note                    func() string
	}
	for _, s := range []spec{
		{use: "fs", short: "agent workloads (untar, git, grep, stat, build, install, rm -rf, fsync, reads) and data rows against ext4 and the overlays", only: "agent,io"},
		{use: "snapshot", short: "snapshot, fork and diff latency against tree size, against btrfs, overlayfs, git and cp -a", only: "snapfork,diff"},
		{use: "fork", short: "fork latency of a filesystem branch (plain and pooled mounts) against btrfs and overlayfs", only: "snapfork",
			tools: "tine,tine pool,btrfs,overlayfs", note: vmForkNote},
	} {
		s := s
		var quick, tiny, csv bool
		var save, dir, tools string
		c := &cobra.Command{
			Use:   s.use,
			Short: s.short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				args := []string{"--only", s.only, "--dir", dir}
				if quick {
					args = append(args, "--quick")
				}
				if tiny {
					args = append(args, "--tiny")
				}
				switch {
				case a.json:
					args = append(args, "--json")
				case csv:
					args = append(args, "--csv")
				}
				if save != "" {
					args = append(args, "--save", save)
				}
				if tools == "" {
					tools = s.tools
				}
				if tools != "" {
					args = append(args, "--tools", tools)
				}
				if s.note != nil {
					if n := s.note(); n != "" {
						fmt.Fprintln(a.stderr, n)
					}
				}
				bar := newProgressBar(a.stderr)
				code := fsbench.Main(args, a.stdout, a.stderr, fsbench.Options{Name: "tine bench " + s.use, Progress: bar.update})
				bar.finish()
				if code != 0 {
					return exitCode(code)
				}
				return nil
			},
		}
		f := c.Flags()
		f.BoolVar(&quick, "quick", false, "smaller trees and fewer samples (minutes, not tens of minutes)")
		f.BoolVar(&tiny, "tiny", false, "smallest sizes, one sample: checks that every row runs")
		f.BoolVar(&csv, "csv", false, "print CSV, one line per row and tool, with every sample")
		f.StringVar(&save, "save", "", "also write the results as JSON to this file (input of go run ./bench/report)")
		f.StringVar(&dir, "dir", "/var/tmp", "directory for the trees, images and mounts")
		f.StringVar(&tools, "tools", "", "comma-separated tools to run (default: all of this benchmark's)")
		cmd.AddCommand(c)
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "sandbox",
		Short: "sandbox create, fork fan-out and agent loop against bubblewrap, podman and git worktree (runs bench/sandbox from a source checkout)",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			root, err := moduleRoot()
			if err != nil {
				return err
			}
			run := exec.CommandContext(cmd.Context(), "go", append([]string{"run", "./bench/sandbox"}, args...)...)
			run.Dir, run.Stdout, run.Stderr = root, a.stdout, a.stderr
			if err := run.Run(); err != nil {
				return fmt.Errorf("go run ./bench/sandbox in %s: %w", root, err)
			}
			return nil
		},
	})
	return cmd
}

// vmForkNote says why the VM fork rows are missing where they are.
func vmForkNote() string {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tine bench fork: no /dev/kvm here, so VM forks (bench/vmm) are not measured; the filesystem fork rows follow."
	}
	return "tine bench fork: VM forks are measured by go run ./bench/vmm; the filesystem fork rows follow."
}

// moduleRoot finds the tine source checkout around the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module tine\n") {
			if _, err := os.Stat(filepath.Join(dir, "bench", "sandbox")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("tine bench sandbox builds bench/sandbox from source: run it inside a tine source checkout (with Go installed)")
		}
		dir = parent
	}
}

// progressBar draws the benchmark's progress on a terminal, or prints a
// line per step elsewhere.
type progressBar struct {
	w    io.Writer
	tty  bool
	last string
}

func newProgressBar(w io.Writer) *progressBar {
	p := &progressBar{w: w}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
	}
	return p
}

func (p *progressBar) update(done, total int, what string) {
	if total <= 0 {
		return
	}
	if !p.tty {
		line := fmt.Sprintf("[%d/%d] %s", done, total, what)
		if line != p.last {
			fmt.Fprintln(p.w, line)
			p.last = line
		}
		return
	}
	const width = 30
	n := done * width / total
	fmt.Fprintf(p.w, "\r\033[K[%s%s] %d/%d %s", strings.Repeat("#", n), strings.Repeat(".", width-n), done, total, what)
}

func (p *progressBar) finish() {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
