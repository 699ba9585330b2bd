package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"tine/cowfs"
)

// promoteFlags registers the flags of fs promote: --dry-run, the diff
// filters, and one opt-in for each privilege a promotion may carry.
func promoteFlags(fs *pflag.FlagSet, o *fsOpts) {
	fs.BoolVar(&o.dryRun, "dry-run", false, "list the changes and check for conflicts; write nothing")
	diffFlags(fs, o)
	privilegeFlags(fs, o)
}

// promoteChangeJSON is the --json form of one change of a promotion: the
// change and the permission bits it gets on the host.
type promoteChangeJSON struct {
	changeJSON
	HostMode string `json:"host_mode,omitempty"`
}

// fsPromote applies the changes from BASE to SNAP to the host directory
// DIR, listing every change first (see docs/promote.md).
func fsPromote(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	base, snap, err := resolvePair(ctx, f, pos)
	if err != nil {
		return err
	}
	res, perr := f.Promote(ctx, base, snap, pos[2], cowfs.PromoteOptions{DryRun: o.dryRun, Privileges: o.priv, Diff: o.diff})
	if res == nil {
		return perr
	}
	if o.json {
		changes := make([]promoteChangeJSON, len(res.Changes))
		for i, c := range changesJSON(res.Changes) {
			changes[i].changeJSON = c
			if res.Changes[i].New != nil {
				changes[i].HostMode = fmt.Sprintf("%04o", res.Modes[i])
			}
		}
		conflicts := make([]cowfs.Refusal, len(res.Conflicts))
		for i, c := range res.Conflicts {
			conflicts[i] = cowfs.Refusal(c)
		}
		if err := writeJSON(w, map[string]any{
			"changes": changes, "conflicts": refusalsJSON(conflicts), "refused": refusalsJSON(res.Refused),
			"applied": res.Applied, "applied_count": len(res.Changes) - len(res.Refused),
		}); err != nil {
			return err
		}
		return perr
	}
	printPlan(w, res)
	printRefused(w, "refused", res.Refused)
	for _, c := range res.Conflicts {
		fmt.Fprintf(w, "conflict %q: %s\n", c.Path, c.Reason)
	}
	n, m := len(res.Changes)-len(res.Refused), len(res.Refused)
	switch {
	case perr != nil:
		return perr
	case res.Applied:
		fmt.Fprintf(w, "applied %d changes to %s, refused %d (listed above)\n", n, pos[2], m)
	default:
		fmt.Fprintf(w, "dry run: %d changes to apply, %d refused (listed above), no conflicts; nothing written\n", n, m)
	}
	return nil
}

// printPlan lists a promotion's changes one a line: the kind's letter
// (see printChanges), the mode on the host ("old->new" where it changes,
// "link" for a symlink), the path, and the type when it is neither file,
// directory nor symlink.
func printPlan(w io.Writer, res *cowfs.PromoteResult) {
	marks := map[cowfs.ChangeKind]string{cowfs.Added: "A", cowfs.Deleted: "D", cowfs.Modified: "M", cowfs.TypeChanged: "T", cowfs.ModeChanged: "P"}
	mode := func(e *cowfs.Entry, m uint32) string {
		if e.Type == cowfs.TypeSymlink {
			return "link"
		}
		return fmt.Sprintf("%04o", m)
	}
	for i, c := range res.Changes {
		var m, typ string
		switch {
		case c.New == nil:
			m = mode(c.Old, c.Old.Mode&0o7777)
		case c.Old == nil:
			m = mode(c.New, res.Modes[i])
		default:
			m = mode(c.Old, c.Old.Mode&0o7777)
			if nw := mode(c.New, res.Modes[i]); nw != m {
				m += "->" + nw
			}
		}
		if e := c.New; e != nil && e.Type != cowfs.TypeFile && e.Type != cowfs.TypeDir && e.Type != cowfs.TypeSymlink {
			typ = " (" + e.Type.String() + ")"
		}
		p := c.Path
		if p == "" {
			p = "."
		}
		fmt.Fprintf(w, "%s %s %s%s\n", marks[c.Kind], m, quoted(p), typ)
	}
}
