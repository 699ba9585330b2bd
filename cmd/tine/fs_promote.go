package main

import (
	"context"
	"fmt"
	"io"

	"tine/cowfs"
)

// fsPromote applies the changes from BASE to SNAP to the host directory
// DIR, listing every change first (see docs/promote.md).
func fsPromote(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	base, snap, err := resolvePair(ctx, f, pos)
	if err != nil {
		return err
	}
	res, perr := f.Promote(ctx, base, snap, pos[2], o.dryRun)
	if res == nil {
		return perr
	}
	if o.json {
		conflicts := res.Conflicts
		if conflicts == nil {
			conflicts = []cowfs.Conflict{}
		}
		if err := writeJSON(w, map[string]any{
			"changes": changesJSON(res.Changes), "conflicts": conflicts, "applied": res.Applied,
		}); err != nil {
			return err
		}
		return perr
	}
	printChanges(w, res.Changes)
	for _, c := range res.Conflicts {
		fmt.Fprintf(w, "conflict %q: %s\n", c.Path, c.Reason)
	}
	switch {
	case perr != nil:
		return perr
	case res.Applied:
		fmt.Fprintf(w, "applied %d changes to %s\n", len(res.Changes), pos[2])
	default:
		fmt.Fprintf(w, "dry run: %d changes, no conflicts; nothing written\n", len(res.Changes))
	}
	return nil
}
