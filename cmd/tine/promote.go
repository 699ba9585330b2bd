package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"tine/api"
)

func (a *app) promoteCommand() *cobra.Command {
	var req api.PromoteRequest
	c := &cobra.Command{
		Use:   "promote SB",
		Short: "merge the sandbox's changes into the directory it came from (three-way), or resume or abort one that stopped",
		Long: `Merges the sandbox's changes into a host directory, three ways: the base is
the directory as the sandbox started from it, ours the directory now, theirs
the sandbox. Changes that do not overlap are applied though the directory
moved; text files changed on both sides are merged line by line; any other
clash is a conflict, listed with both sides, and nothing is written unless
--partial. Each entry is written whole and renamed into place under a
journal: a promotion that stopped partway is finished with --resume or
undone with --abort.`,
		Args: nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			res, err := cl.Promote(c.Context(), args[0], req)
			if err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				if err := writeJSON(a.stdout, res); err != nil {
					return err
				}
			} else {
				a.printPromote(res, req)
			}
			if res.Error != nil {
				return fmt.Errorf("sandbox %q: %s", args[0], res.Error.Message)
			}
			if !res.Applied && !req.DryRun {
				return fmt.Errorf("sandbox %q: not promoted: %d conflicts, %d refused; see the list above", args[0], len(res.Conflicts)+len(res.Merge), len(res.Refused))
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&req.To, "to", "", "the directory to promote into (default: the one the sandbox was made from)")
	f.BoolVar(&req.DryRun, "dry-run", false, "show the plan (deletions included) and the conflicts; write nothing")
	f.BoolVar(&req.Partial, "partial", false, "apply what merges cleanly even when some paths conflict")
	f.BoolVar(&req.Resume, "resume", false, "finish a promotion of SB that stopped partway")
	f.BoolVar(&req.Abort, "abort", false, "undo a promotion of SB that stopped partway")
	f.BoolVar(&req.AllowSetid, "allow-setid", false, "keep setuid and setgid bits")
	f.BoolVar(&req.AllowDevice, "allow-devices", false, "create character and block device nodes")
	f.BoolVar(&req.KeepOwners, "keep-owners", false, "keep the sandbox's uid and gid (default: the running user's)")
	c.MarkFlagsMutuallyExclusive("resume", "abort")
	return c
}

// printPromote writes a promotion's plan and outcome for people.
func (a *app) printPromote(res *api.PromoteResponse, req api.PromoteRequest) {
	w := a.stdout
	if res.HostChanged > 0 {
		fmt.Fprintf(w, "the host changed %d path(s) since the sandbox's base (%s)\n", res.HostChanged, strings.Join(res.HostExamples, ", "))
	}
	for _, ch := range res.Changes {
		fmt.Fprintf(w, "%s %s\n", changeLetter(ch.Kind), changePath(ch))
	}
	for _, p := range res.Merged {
		fmt.Fprintf(w, "merged line by line: %s\n", p)
	}
	for _, m := range res.Merge {
		fmt.Fprintf(w, "conflict: %s: %s (host: %s, sandbox: %s)\n", m.Path, m.Reason, m.Ours, m.Theirs)
		for _, h := range m.Hunks {
			fmt.Fprintf(w, "  host, line %d:\n", h.OursStart)
			for _, l := range h.Ours {
				fmt.Fprintf(w, "  < %s", ended(l))
			}
			fmt.Fprintf(w, "  sandbox, line %d:\n", h.TheirsStart)
			for _, l := range h.Theirs {
				fmt.Fprintf(w, "  > %s", ended(l))
			}
		}
	}
	for _, cf := range res.Conflicts {
		fmt.Fprintf(w, "conflict: %s: %s\n", cf.Path, cf.Reason)
	}
	for _, r := range res.Refused {
		fmt.Fprintf(w, "refused: %s: %s\n", r.Path, r.Reason)
	}
	switch {
	case res.Applied:
		fmt.Fprintf(w, "applied %d changes to %s\n", len(res.Changes), res.Dir)
	case req.DryRun && res.Error == nil:
		fmt.Fprintf(w, "dry run: %d changes would apply to %s; nothing written\n", len(res.Changes), res.Dir)
	default:
		fmt.Fprintln(w, "nothing written")
	}
}

// ended is line l with a newline at its end.
func ended(l string) string {
	if strings.HasSuffix(l, "\n") {
		return l
	}
	return l + "\n"
}
