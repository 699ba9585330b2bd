package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"tine/api"
	"tine/api/client"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// sandboxCommands are the commands on sandboxes; each talks to the daemon
// and starts it when it does not answer.
func (a *app) sandboxCommands() []*cobra.Command {
	return append([]*cobra.Command{
		a.createCommand(), a.execCommand(), a.shellCommand(), a.forkCommand(),
		a.snapshotCommand(), a.rollbackCommand(), a.snapshotsCommand(), a.diffCommand(),
		a.psCommand(), a.portsCommand(), a.logsCommand(), a.statusCommand(), a.lsCommand(),
		a.rmCommand(), a.startCommand(), a.stopCommand(), a.promoteCommand(), a.imageCommand(), a.cpCommand(),
	}, append(a.policyCommands(), a.messageCommands()...)...)
}

// sbErr turns an API error about sandbox name into one that names it and
// says what to do.
func sbErr(name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sandbox.ErrNotFound):
		var ce *client.Error
		if errors.As(err, &ce) && !strings.Contains(ce.Message, "snapshot") {
			return fmt.Errorf("sandbox %q not found; list sandboxes with \"tine ls\"", name)
		}
		return fmt.Errorf("%v; list its snapshots with \"tine snapshots %s\"", err, name)
	case errors.Is(err, sandbox.ErrNotRunning):
		return fmt.Errorf("sandbox %q is stopped; start it with \"tine start %s\"", name, name)
	case errors.Is(err, sandbox.ErrExists) && strings.Contains(err.Error(), "create sandbox"):
		return fmt.Errorf("sandbox %q already exists; choose another --name or remove it with \"tine rm %s\"", name, name)
	}
	return apiError(err)
}

// apiError maps the API's bad_request to a usage error (exit code 2).
func apiError(err error) error {
	var ce *client.Error
	if errors.As(err, &ce) && ce.Code == "bad_request" {
		return usageErr("%s", ce.Message)
	}
	return err
}

// table writes aligned columns.
func table(w io.Writer, header string, rows func(tw io.Writer)) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	rows(tw)
	return tw.Flush()
}

func (a *app) createCommand() *cobra.Command {
	var req api.CreateRequest
	var from, disk string
	var lf limitFlags
	var sf specFlags
	var pf createPolicyFlags
	var vf vmFlags
	c := &cobra.Command{
		Use:   "create [DIR|SNAPSHOT]",
		Short: "create and start a sandbox from a directory (default: the current one) or a snapshot",
		Args:  rangeArgs(0, 1, "the directory or snapshot to start from"),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			if len(args) == 1 {
				if sf.file != "" || sf.devcontainer != "" {
					return usageErr("%q: the spec says where the sandbox starts; give no directory with -f or --devcontainer", args[0])
				}
				if from != "" && from != args[0] {
					return usageErr("give the directory or snapshot once, as %q or as --from %q", args[0], from)
				}
				from = args[0]
			}
			if sf.file != "" || sf.devcontainer != "" {
				return a.createFromSpec(c, sf, req.Name)
			}
			if from == "" {
				from = "."
			}
			st, serr := os.Stat(from)
			if serr == nil && st.IsDir() {
				abs, err := filepath.Abs(from)
				if err != nil {
					return err
				}
				req.From = abs
			} else if strings.ContainsRune(from, '/') || from == "." {
				why := "not a directory"
				if pe := (*os.PathError)(nil); errors.As(serr, &pe) {
					why = pe.Err.Error()
				}
				return usageErr("%s: %s (give a directory or a snapshot id)", from, why)
			} else {
				req.From = from
			}
			if disk != "" {
				n, err := parseSize(disk)
				if err != nil {
					return usageErr("--disk: %v", err)
				}
				req.Limits.ProjectBytes = n
			}
			if err := lf.apply(&req.Limits); err != nil {
				return err
			}
			for _, e := range req.Env {
				if !strings.Contains(e, "=") {
					return usageErr("--env %q: want KEY=VALUE", e)
				}
			}
			if err := pf.apply(&req, a.stderr); err != nil {
				return err
			}
			if err := vf.check(); err != nil {
				return err
			}
			if err := vf.guest(&req); err != nil {
				return err
			}
			req.Runtime = vf.name()
			cl, err := a.daemon(ctx)
			if err != nil {
				return err
			}
			sb, err := cl.Create(ctx, req)
			if err != nil {
				if req.Image != "" && isNotFound(err) && strings.Contains(err.Error(), "image") {
					return imgErr(req.Image, err)
				}
				return sbErr(req.Name, err)
			}
			if a.json {
				return writeJSON(a.stdout, sb)
			}
			fmt.Fprintf(a.stdout, "%s\n", sb.Name)
			fmt.Fprintf(a.stderr, "created sandbox %s from %s (project at %s); run commands with \"tine exec %s -- CMD\"\n",
				sb.Name, sb.From, sb.ProjectPath, sb.Name)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&from, "from", "", "host directory or sandbox snapshot to start from (default: the current directory)")
	f.StringVar(&req.Name, "name", "", "the sandbox's name (default: a generated one)")
	f.StringArrayVar(&req.Services, "service", nil, "shell command started at every start of the sandbox (repeatable)")
	f.StringArrayVar(&req.Env, "env", nil, "KEY=VALUE in the environment of its commands (repeatable)")
	f.Int64Var(&req.Limits.Pids, "pids", 0, "most processes at once (0: no limit)")
	f.StringVar(&disk, "disk", "", "most bytes written to the project, such as 512M or 1G (default: no limit)")
	f.StringVar(&req.Image, "image", "", "run over this image (tine image ls) in place of the host's OS; the project is still at its path")
	f.StringVar(&req.ImageWorkdir, "image-workdir", "", "with --image: working directory of commands that give none (default: the project directory)")
	lf.bind(f, false) // limits.go
	sf.flags(f)
	pf.flags(f)
	vf.flags(f)
	messageToFlag(f, &req.MessageTo) // messages.go
	return c
}

func (a *app) forkCommand() *cobra.Command {
	var req api.ForkRequest
	var names string
	c := &cobra.Command{
		Use:   "fork SB",
		Short: "make N sandboxes from a snapshot of SB taken now",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			if names != "" {
				req.Names = strings.Split(names, ",")
				if !c.Flags().Changed("n") {
					req.N = len(req.Names)
				}
			}
			if req.N < 1 {
				return usageErr("-n must be at least 1")
			}
			if req.N > api.MaxForks {
				return usageErr("-n %d: one fork makes at most %d sandboxes; fork again for more", req.N, api.MaxForks)
			}
			if req.Names != nil && len(req.Names) != req.N {
				return usageErr("--names gives %d names for -n %d", len(req.Names), req.N)
			}
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			kids, err := cl.Fork(c.Context(), args[0], req)
			if err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				return writeJSON(a.stdout, kids)
			}
			for _, k := range kids {
				if k.GitBase.Branch != "" {
					fmt.Fprintf(a.stdout, "%s\tgit branch %s (on `tine promote %s --git-branch`)\n", k.Name, k.GitBase.Branch, k.Name)
					continue
				}
				fmt.Fprintln(a.stdout, k.Name)
			}
			return nil
		},
	}
	c.Flags().StringVar(&req.GitBranches, "git-branches", "", "record a git branch per fork from this template ({i}: 1..N, {name}: the fork's name); `tine promote FORK --git-branch` with no name commits there")
	c.Flags().IntVarP(&req.N, "n", "n", 1, "number of forks")
	c.Flags().StringVar(&names, "names", "", "comma-separated names of the forks (default: SB-1 .. SB-N, numbered on after the highest SB-K that exists)")
	return c
}

func (a *app) snapshotCommand() *cobra.Command {
	var req api.SnapshotRequest
	c := &cobra.Command{
		Use:   "snapshot SB",
		Short: "fix the sandbox's files and state at this instant",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			s, err := cl.Snapshot(c.Context(), args[0], req)
			if err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				return writeJSON(a.stdout, s)
			}
			fmt.Fprintln(a.stdout, s.ID)
			return nil
		},
	}
	c.Flags().StringVar(&req.Name, "name", "", "label for the snapshot, unique in the sandbox")
	return c
}

func (a *app) rollbackCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rollback SB SNAP",
		Short: "return the sandbox to one of its snapshots (id or label)",
		Args:  nArgs("SB", "SNAP"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			if err := cl.Rollback(c.Context(), args[0], api.RollbackRequest{Snapshot: args[1]}); err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				return writeJSON(a.stdout, map[string]string{"sandbox": args[0], "snapshot": args[1]})
			}
			fmt.Fprintf(a.stdout, "sandbox %s is at snapshot %s\n", args[0], args[1])
			return nil
		},
	}
}

func (a *app) snapshotsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshots SB",
		Short: "list the sandbox's snapshots, oldest first",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			ss, err := cl.Snapshots(c.Context(), args[0])
			if err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				if ss == nil {
					ss = []sandbox.SnapshotInfo{}
				}
				return writeJSON(a.stdout, ss)
			}
			return table(a.stdout, "ID\tNAME\tCREATED", func(w io.Writer) {
				for _, s := range ss {
					fmt.Fprintf(w, "%s\t%s\t%s\n", s.ID, s.Name, s.Created.Local().Format(time.DateTime))
				}
			})
		},
	}
}

func (a *app) diffCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "diff SB [SNAP]",
		Short: "list every change to the project since its origin (or since SNAP), deletions included",
		Args:  rangeArgs(1, 2, "a sandbox and an optional snapshot"),
		RunE: func(c *cobra.Command, args []string) error {
			snap := ""
			if len(args) == 2 {
				snap = args[1]
			}
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			// Each change is written as it comes: a diff of a package
			// install is never held whole.
			w := bufio.NewWriter(a.stdout) // one write per line made a big diff into a pipe slow
			n := 0
			err = cl.DiffEach(c.Context(), args[0], snap, func(ch api.Change) error {
				n++
				if !a.json {
					_, err := fmt.Fprintf(w, "%s %s\n", changeLetter(ch.Kind), changePath(ch.Path, ch.PathB64))
					return err
				}
				sep := ",\n"
				if n == 1 {
					sep = "[\n"
				}
				b, err := json.MarshalIndent(ch, "  ", "  ")
				if err == nil {
					_, err = fmt.Fprintf(w, "%s  %s", sep, b)
				}
				return err
			})
			if err != nil {
				w.Flush()
				return sbErr(args[0], err)
			}
			switch {
			case a.json && n == 0:
				w.WriteString("[]\n")
			case a.json:
				w.WriteString("\n]\n")
			}
			return w.Flush()
		},
	}
}

// changeLetter is the one-letter form of a change kind, as "tine fs diff"
// prints it.
func changeLetter(kind string) string {
	switch kind {
	case "added":
		return "A"
	case "deleted":
		return "D"
	case "modified":
		return "M"
	case "mode-changed":
		return "P"
	}
	return "T"
}

// changePath is a changed path for a terminal: base64 of its bytes
// (b64, as the API gives them) when they are not UTF-8, else quoted when
// it is not plain printable text.
func changePath(path, b64 string) string {
	if b64 != "" {
		return "base64:" + b64
	}
	return shown(path)
}

func (a *app) psCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ps SB",
		Short: "list the sandbox's processes",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			ps, err := cl.Ps(c.Context(), args[0])
			if err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				return writeJSON(a.stdout, ps)
			}
			return table(a.stdout, "PID\tPPID\tUSER\tSTATE\tRSS\tCOMMAND", func(w io.Writer) {
				for _, p := range ps {
					io.WriteString(w, psRow(p))
				}
			})
		},
	}
}

func (a *app) logsCommand() *cobra.Command {
	var o sandbox.LogOptions
	c := &cobra.Command{
		Use:   "logs SB",
		Short: "print the output of the sandbox's services",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			r, err := cl.Logs(c.Context(), args[0], o)
			if err != nil {
				return sbErr(args[0], err)
			}
			defer r.Close()
			if a.json {
				b, err := io.ReadAll(io.LimitReader(r, 64<<20))
				if err != nil && c.Context().Err() == nil {
					return err
				}
				return writeJSON(a.stdout, map[string]string{"sandbox": args[0], "logs": string(b)})
			}
			if _, err := io.Copy(a.stdout, r); err != nil && c.Context().Err() == nil {
				return err
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&o.Follow, "follow", "f", false, "keep printing output as it is written")
	c.Flags().IntVar(&o.Tail, "tail", 0, "start this many lines before the end (0: from the start)")
	return c
}

func (a *app) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status SB",
		Short: "show a sandbox: state, origin, usage, and how far its origin directory moved on",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			s, err := cl.Get(c.Context(), args[0])
			if err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				return writeJSON(a.stdout, s)
			}
			w := a.stdout
			fmt.Fprintf(w, "sandbox    %s (%s, runtime %s)\n", s.Name, s.State, s.Runtime)
			if s.State == sandbox.Stopped && s.StopReason != "" {
				fmt.Fprintf(w, "stopped    %s\n", s.StopReason)
			}
			fmt.Fprintf(w, "project    %s\n", s.ProjectPath)
			from := s.From
			if s.ForkedFrom != "" {
				from += " (forked from " + s.ForkedFrom + ")"
			}
			fmt.Fprintf(w, "from       %s\n", from)
			if s.Image != nil {
				fmt.Fprintf(w, "image      %s\n", imageLine(s.Image))
			}
			fmt.Fprintf(w, "created    %s\n", s.Created.Local().Format(time.DateTime))
			fmt.Fprintf(w, "processes  %d, listening sockets %d\n", s.Processes, s.Ports)
			written := humanBytes(s.ProjectBytes)
			if s.Limits.ProjectBytes > 0 {
				written += " of " + humanBytes(s.Limits.ProjectBytes)
			}
			fmt.Fprintf(w, "written    %s\n", written)
			if s.Limits.Pids > 0 {
				fmt.Fprintf(w, "pids limit %d\n", s.Limits.Pids)
			}
			fmt.Fprintf(w, "messages   to %s\n", messageToText(s.MessageTo))
			if g := s.Guest; g != nil {
				fmt.Fprintf(w, "guest      %s memory, %d vCPUs\n", humanBytes(g.MemoryBytes), g.CPUs)
			}
			st := s.Stale
			switch {
			case st.Unknown != "":
				fmt.Fprintf(w, "stale      unknown: %s\n", st.Unknown)
			case st.Changed+st.Added+st.Removed == 0:
				fmt.Fprintf(w, "stale      no: %s has not changed on the host since the sandbox was made\n", s.ProjectPath)
			default:
				// Forks compare with the host too: their From is a snapshot.
				fmt.Fprintf(w, "stale      yes: since the sandbox was made, %s on the host has %s changed, %d added, %d removed\n",
					s.ProjectPath, files(st.Changed), st.Added, st.Removed)
				for _, e := range st.Examples {
					fmt.Fprintf(w, "             %s\n", shown(e))
				}
			}
			if gs := st.Git; gs != nil {
				if gs.Unknown != "" {
					fmt.Fprintf(w, "git        unknown: %s\n", gs.Unknown)
				} else if gs.Head == gs.Base {
					fmt.Fprintf(w, "git        the origin's HEAD is still %s, the commit the sandbox was made from\n", short(gs.Base))
				} else {
					fmt.Fprintf(w, "git        the origin's HEAD moved %d commit(s) since %s, the commit the sandbox was made from; %d path(s) changed %s\n", gs.Commits, short(gs.Base), gs.Changed, shownAll(gs.Examples, " "))
				}
			}
			return nil
		},
	}
}

func (a *app) lsCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "list sandboxes",
		Args:    nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			// The table shows metadata only: it needs no status.
			list := cl.ListInfo
			if a.json {
				list = cl.List
			}
			sbs, err := list(c.Context())
			if err != nil {
				return apiError(err)
			}
			if a.json {
				if sbs == nil {
					sbs = []api.Sandbox{}
				}
				return writeJSON(a.stdout, sbs)
			}
			return table(a.stdout, "NAME\tSTATE\tPROJECT\tFROM\tCREATED", func(w io.Writer) {
				for _, s := range sbs {
					if s.State == sandbox.Damaged {
						fmt.Fprintf(w, "%s\t%s\t(%s)\t\t\n", s.Name, s.State, s.Problem)
						continue
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.State, s.ProjectPath, s.From, s.Created.Local().Format(time.DateTime))
				}
			})
		},
	}
}

// eachSandbox runs op on every named sandbox, reporting each result, and
// fails when one failed.
func (a *app) eachSandbox(ctx context.Context, names []string, verb string, op func(*client.Client, string) error) error {
	cl, err := a.daemon(ctx)
	if err != nil {
		return err
	}
	var errs []error
	done := []string{}
	for _, n := range names {
		if err := op(cl, n); err != nil {
			errs = append(errs, sbErr(n, err))
			continue
		}
		done = append(done, n)
		if !a.json {
			fmt.Fprintf(a.stdout, "%s %s\n", verb, n)
		}
	}
	if a.json {
		if err := writeJSON(a.stdout, map[string][]string{verb: done}); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

func (a *app) rmCommand() *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:   "rm SB...",
		Short: "stop and delete sandboxes (a running one needs -f)",
		Args:  minArgs(1, "one or more sandboxes"),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			return a.eachSandbox(ctx, args, "removed", func(cl *client.Client, n string) error {
				if !force {
					s, err := cl.Get(ctx, n)
					if err != nil {
						return err
					}
					if s.State == sandbox.Running {
						return fmt.Errorf("sandbox %q is running; stop it with \"tine stop %s\" or remove it anyway with \"tine rm -f %s\"", n, n, n)
					}
				}
				return cl.Remove(ctx, n)
			})
		},
	}
	c.Flags().BoolVarP(&force, "force", "f", false, "remove running sandboxes too")
	return c
}

func (a *app) startCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "start SB...",
		Short: "start stopped sandboxes",
		Args:  minArgs(1, "one or more sandboxes"),
		RunE: func(c *cobra.Command, args []string) error {
			return a.eachSandbox(c.Context(), args, "started", func(cl *client.Client, n string) error {
				return cl.Start(c.Context(), n)
			})
		},
	}
}

func (a *app) stopCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "stop SB...",
		Short: "stop sandboxes: their processes end, their files stay",
		Args:  minArgs(1, "one or more sandboxes"),
		RunE: func(c *cobra.Command, args []string) error {
			return a.eachSandbox(c.Context(), args, "stopped", func(cl *client.Client, n string) error {
				return cl.Stop(c.Context(), n)
			})
		},
	}
}

// psRow is one line of tine ps. Every string in it is the agent's, which
// the sandbox may have forged: each is shown escaped where unsafe.
func psRow(p proto.Process) string {
	cmd := shownAll(p.Argv, " ")
	if cmd == "" {
		cmd = "[" + shown(p.Comm) + "]"
	}
	user := shown(p.User)
	if user == "" {
		user = fmt.Sprint(p.UID)
	}
	return fmt.Sprintf("%d\t%d\t%s\t%s\t%s\t%s\n", p.PID, p.PPID, user, shown(p.State), humanBytes(int64(p.RSS)), cmd)
}

// files is "1 file" or "N files".
func files(n int) string {
	if n == 1 {
		return "1 file"
	}
	return fmt.Sprintf("%d files", n)
}
