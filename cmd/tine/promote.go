package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"tine/api"
)

func (a *app) promoteCommand() *cobra.Command {
	var req api.PromoteRequest
	var verifyTimeout time.Duration
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
undone with --abort.

With --git-branch NAME it writes one commit on a new branch NAME of the
repository the sandbox came from instead, with git plumbing and every hook
off; the work tree, the index and HEAD are not touched. The parent is the
commit the sandbox was made from; --onto REV merges onto REV three ways;
--keep-commits keeps the commits the sandbox made itself. --git-branch with
no name uses the branch a fork --git-branches recorded.

With --verify CMD the result is checked first: the merged tree (for a git
branch, a clean checkout of the commit) is given to a new sandbox with a
fresh OS layer and no network, CMD runs there (sh -c, in the project
directory), and nothing is written unless it exits 0. The check's command,
exit code and the end of its output are kept in the promotion's record in
the state root.`,
		Args: rangeArgs(1, 2, "SB [--git-branch NAME]"),
		RunE: func(c *cobra.Command, args []string) error {
			if err := gitArgs(c, &req, args); err != nil {
				return err
			}
			if verifyTimeout > 0 {
				if req.Verify == "" {
					return usageErr("--verify-timeout goes with --verify")
				}
				req.VerifyTimeoutS = max(1, int((verifyTimeout+time.Second-1)/time.Second))
			}
			if req.KeepVerify && req.Verify == "" {
				return usageErr("--keep-verify goes with --verify")
			}
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
			} else if res.Git != nil {
				a.printPromoteGit(res)
			} else {
				a.printPromote(res, req)
			}
			if !a.json {
				a.printVerify(res)
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
	f.StringVar(&req.GitBranch, "git-branch", "", "commit to a new branch NAME of the origin repository (no NAME: the one fork --git-branches recorded)")
	f.Lookup("git-branch").NoOptDefVal = recordedBranch
	f.StringVar(&req.Message, "message", "", "the commit's message (with --git-branch)")
	f.StringVar(&req.Author, "author", "", "the commit's author, \"Name <email>\" (with --git-branch)")
	f.StringVar(&req.Onto, "onto", "", "merge onto this revision of the origin (e.g. HEAD) three ways (with --git-branch)")
	f.BoolVar(&req.KeepCommits, "keep-commits", false, "keep the commits the sandbox made in its copy of the repository (with --git-branch)")
	f.StringVar(&req.Verify, "verify", "", "run this check (sh -c, in the project directory) on the result in a sandbox of its own first; promote only if it exits 0")
	f.DurationVar(&verifyTimeout, "verify-timeout", 0, "kill the check after this long (it fails); 0: no limit")
	f.BoolVar(&req.KeepVerify, "keep-verify", false, "keep the verification sandbox for inspection")
	c.MarkFlagsMutuallyExclusive("resume", "abort")
	for _, g := range []string{"resume", "abort"} {
		c.MarkFlagsMutuallyExclusive(g, "verify")
	}
	for _, g := range []string{"to", "partial", "resume", "abort"} {
		c.MarkFlagsMutuallyExclusive(g, "git-branch")
	}
	return c
}

// recordedBranch is --git-branch given without a name. The help shows it,
// and git refuses it as a branch name (a colon), so no branch is taken for
// it.
const recordedBranch = ":recorded"

// gitArgs settles --git-branch: "--git-branch NAME" arrives as a second
// argument (the flag takes an optional value), "--git-branch=NAME" as the
// flag's value, a bare "--git-branch" as the recorded branch.
func gitArgs(c *cobra.Command, req *api.PromoteRequest, args []string) error {
	if !c.Flags().Changed("git-branch") {
		if len(args) > 1 {
			return usageErr("want 1 argument (SB), got %d", len(args))
		}
		for _, g := range []string{"message", "author", "onto", "keep-commits"} {
			if c.Flags().Changed(g) {
				return usageErr("--%s goes with --git-branch", g)
			}
		}
		return nil
	}
	req.Git = true
	if req.GitBranch == recordedBranch {
		req.GitBranch = ""
		if len(args) == 2 {
			req.GitBranch = args[1]
		}
	} else if len(args) > 1 {
		return usageErr("want 1 argument (SB), got %d", len(args))
	}
	return nil
}

// printPromoteGit writes a promotion to git for people.
func (a *app) printPromoteGit(res *api.PromoteResponse) {
	w, g := a.stdout, res.Git
	if g.HostCommits > 0 {
		fmt.Fprintf(w, "the origin's HEAD moved %d commit(s) since the sandbox's base %s, changing %d path(s)\n", g.HostCommits, short(g.Base), len(g.HostChanged))
	}
	for _, k := range g.Kept {
		fmt.Fprintf(w, "kept commit %s\n", short(k))
	}
	for _, ch := range g.Changes {
		fmt.Fprintf(w, "%s %s %s\n", ch.Status, ch.Mode, changePath(ch.Path, ch.PathB64))
	}
	for _, p := range g.Merged {
		fmt.Fprintf(w, "merged line by line: %s\n", shown(p))
	}
	for _, r := range g.Refused {
		fmt.Fprintf(w, "left out: %s: %s", shown(r.Path), shownLine(r.Reason+"\n"))
	}
	for _, m := range g.Merge {
		fmt.Fprintf(w, "conflict: %s: %s", shown(m.Path), shownLine(fmt.Sprintf("%s (host: %s, sandbox: %s)\n", m.Reason, m.Ours, m.Theirs)))
		for _, h := range m.Hunks {
			fmt.Fprintf(w, "  host, line %d:\n", h.OursStart)
			for _, l := range h.Ours {
				fmt.Fprintf(w, "  < %s", shownLine(ended(l)))
			}
			fmt.Fprintf(w, "  sandbox, line %d:\n", h.TheirsStart)
			for _, l := range h.Theirs {
				fmt.Fprintf(w, "  > %s", shownLine(ended(l)))
			}
		}
	}
	switch {
	case g.Applied:
		fmt.Fprintf(w, "branch %s at %s (parent %s) in %s\n", g.Branch, short(g.Commit), short(g.Parent), g.Repo)
	case g.Commit != "":
		fmt.Fprintf(w, "dry run: branch %s would be at %s (parent %s); no branch made\n", g.Branch, short(g.Commit), short(g.Parent))
	default:
		fmt.Fprintln(w, "no branch made")
	}
}

// short is the first 12 characters of a commit id.
func short(id string) string { return id[:min(12, len(id))] }

// printPromote writes a promotion's plan and outcome for people.
func (a *app) printPromote(res *api.PromoteResponse, req api.PromoteRequest) {
	w := a.stdout
	if res.HostChanged > 0 {
		fmt.Fprintf(w, "the host changed %d path(s) since the sandbox's base (%s)\n", res.HostChanged, shownAll(res.HostExamples, ", "))
	}
	for _, ch := range res.Changes {
		fmt.Fprintf(w, "%s %s\n", changeLetter(ch.Kind), changePath(ch.Path, ch.PathB64))
	}
	for _, p := range res.Merged {
		fmt.Fprintf(w, "merged line by line: %s\n", shown(p))
	}
	for _, m := range res.Merge {
		fmt.Fprintf(w, "conflict: %s: %s", shown(m.Path), shownLine(fmt.Sprintf("%s (host: %s, sandbox: %s)\n", m.Reason, m.Ours, m.Theirs)))
		for _, h := range m.Hunks {
			fmt.Fprintf(w, "  host, line %d:\n", h.OursStart)
			for _, l := range h.Ours {
				fmt.Fprintf(w, "  < %s", shownLine(ended(l)))
			}
			fmt.Fprintf(w, "  sandbox, line %d:\n", h.TheirsStart)
			for _, l := range h.Theirs {
				fmt.Fprintf(w, "  > %s", shownLine(ended(l)))
			}
		}
	}
	for _, cf := range res.Conflicts {
		fmt.Fprintf(w, "conflict: %s: %s", shown(cf.Path), shownLine(cf.Reason+"\n"))
	}
	for _, r := range res.Refused {
		fmt.Fprintf(w, "refused: %s: %s", shown(r.Path), shownLine(r.Reason+"\n"))
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

// printVerify writes a verified promotion's check for people: the end of
// its output when it failed, then how it ended and where it is recorded.
func (a *app) printVerify(res *api.PromoteResponse) {
	v, w := res.Verify, a.stdout
	if v == nil {
		return
	}
	if !v.Passed && v.Output != "" {
		if v.Truncated {
			fmt.Fprintf(w, "check output (last %d of %d bytes):\n", len(v.Output), v.OutputBytes)
		} else {
			fmt.Fprintln(w, "check output:")
		}
		fmt.Fprint(w, ended(v.Output))
	}
	verdict := "passed"
	if !v.Passed {
		verdict = fmt.Sprintf("FAILED (exit %d)", v.ExitCode)
		if v.TimedOut {
			verdict = "FAILED (timed out)"
		} else if v.KilledBy != "" {
			verdict = fmt.Sprintf("FAILED (killed: %s)", v.KilledReason)
		} else if v.Signal != 0 {
			verdict = fmt.Sprintf("FAILED (signal %d)", v.Signal)
		}
	}
	fmt.Fprintf(w, "check %q %s in %.1fs", v.Command, verdict, v.Seconds)
	if v.Sandbox != "" {
		fmt.Fprintf(w, "; kept in sandbox %s", v.Sandbox)
	}
	fmt.Fprintln(w)
	if res.Record != "" {
		fmt.Fprintf(w, "recorded in %s\n", res.Record)
	}
}
