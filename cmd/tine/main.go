// Command tine is the command-line interface to tine: sandboxes that are
// created, forked, diffed and promoted in milliseconds.
//
// Every command takes the persistent flags --root (the state root) and
// --json (machine-readable output). Sandbox commands talk to the daemon
// (tine serve) over its socket in the state root and start it when it
// does not answer; the fs, store, vm and init families are lower-level
// commands that work on a state root or a store directly.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tine/cowfs"
	"tine/sandbox/ns"
)

// errUsage marks an error caused by bad command-line input (exit code 2).
var errUsage = errors.New("usage")

func usageErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

// exitCode is an error that only carries an exit code: that of a command
// run in a sandbox, which becomes tine's.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

// app holds what every command shares: the persistent flags and the
// process's streams.
type app struct {
	root   string
	json   bool
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

func main() {
	cowfs.GuardMain() // tine serve's FUSE guard re-executes this program
	ns.Init()         // a sandbox's init step re-executes this program
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs one command line and returns the exit code: 0, 1 for a
// failure, 2 for a usage error, or the code of a command run in a sandbox.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

// runContext is run with the caller's context.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdin: os.Stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code)
	}
	name := "tine"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	if strings.HasPrefix(err.Error(), "unknown command") {
		// cobra's own error for an unknown first word.
		fmt.Fprintf(stderr, "tine: %v\n\n", err)
		root.SetOut(stderr)
		root.Usage()
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return exitStatus(err)
}

// exitStatus is the exit code of a command that returned err: 0 for
// none, an exitCode's own, 2 for a usage error, else 1.
func exitStatus(err error) int {
	var code exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.Is(err, errUsage):
		return 2
	}
	return 1
}

// rootCommand builds the command tree. A fresh tree per run keeps flag
// values of one run out of the next.
func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "tine",
		Short: "sandboxes for AI agents: created, forked, diffed and promoted in milliseconds",
		Long: "tine gives a program an exact, isolated copy of a project and its environment,\n" +
			"forks it N ways, snapshots and rolls back, and promotes the winning changes back.",
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetIn(a.stdin)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageErr("%v", err) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.root, "root", defaultRoot(), "state root (store, sandboxes, daemon socket); default $TINE_ROOT or "+builtinRoot+" (as root), ~/.local/share/tine (others)")
	pf.BoolVar(&a.json, "json", false, "print JSON")
	root.AddGroup(&cobra.Group{ID: "sandbox", Title: "Sandboxes:"}, &cobra.Group{ID: "host", Title: "Host and daemon:"},
		&cobra.Group{ID: "low", Title: "Lower-level commands:"})
	for _, c := range a.sandboxCommands() {
		c.GroupID = "sandbox"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.updateCommand(), a.limitsCommand(), a.freezeCommand(), a.thawCommand(),
		a.auditCommand(), a.execPolicyCommand()} {
		c.GroupID = "sandbox"
		root.AddCommand(c)
	}
	for _, c := range a.approvalCommands() {
		c.GroupID = "sandbox"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.infoCommand(), a.serveCommand(), a.completionCommand(), a.initCommand(),
		a.mcpCommand()} {
		c.GroupID = "host"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.fsCommand(), a.storeCommand(), a.vmCommand()} {
		c.GroupID = "low"
		root.AddCommand(c)
	}
	root.AddCommand(a.benchCommand())
	root.SetHelpCommandGroupID("host")
	return root
}

// group returns a command that only holds subcommands: an unknown
// subcommand is a usage error naming it.
func group(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return c.Help()
			}
			return usageErr("unknown command %q; see %q", args[0], c.CommandPath()+" --help")
		},
	}
}

// nArgs checks the number of positional arguments, naming them in the
// usage error.
func nArgs(names ...string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(names) == 0 && len(args) > 0 {
			return usageErr("takes no arguments, got %q", args)
		}
		if len(args) != len(names) {
			return usageErr("want %d arguments (%s), got %d", len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}

// rangeArgs checks that there are between lo and hi positional arguments.
func rangeArgs(lo, hi int, what string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usageErr("want %s, got %d arguments", what, len(args))
		}
		return nil
	}
}

// minArgs checks that there are at least lo positional arguments.
func minArgs(lo int, what string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) < lo {
			return usageErr("want %s", what)
		}
		return nil
	}
}

// flagsSet returns the flags set on the command line other than the
// persistent ones, as name → value.
func flagsSet(fs *pflag.FlagSet) map[string]string {
	set := map[string]string{}
	fs.Visit(func(fl *pflag.Flag) {
		if fl.Name != "root" && fl.Name != "json" {
			set[fl.Name] = fl.Value.String()
		}
	})
	return set
}
