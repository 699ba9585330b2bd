// Command tine is the command-line interface to tine: sandboxes that are
// created, forked, diffed and promoted in milliseconds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand of tine. Each file of this package registers
// its own commands with register, so subcommands stay apart.
type command struct {
	name    string // e.g. "demo" or "fs snapshot"
	summary string // one line for the usage listing
	run     func(ctx context.Context, args []string, stdout io.Writer) error
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("tine: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// errUsage marks an error caused by bad command-line input (exit code 2).
var errUsage = errors.New("usage")

func usageErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: tine <command> [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-22s %s\n", n, commands[n].summary)
	}
}

// lookup finds the longest registered command name that prefixes args
// ("fs snapshot" before "fs") and returns it with the remaining args.
func lookup(args []string) (command, []string, bool) {
	for n := len(args); n > 0; n-- {
		name := args[0]
		for _, a := range args[1:n] {
			name += " " + a
		}
		if c, ok := commands[name]; ok {
			return c, args[n:], true
		}
	}
	return command{}, nil, false
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	c, rest, ok := lookup(args)
	if !ok {
		fmt.Fprintf(stderr, "tine: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.run(ctx, rest, stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "tine %s: %v\n", c.name, err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

// newFlags returns a flag set for a subcommand whose errors are returned,
// not printed and exited on.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("tine "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}
