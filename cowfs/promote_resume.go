package cowfs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// PromoteResume finishes a promotion from snapshot from to snapshot to
// into dir that stopped partway (a crash): each path may hold either
// side. A path that already holds to's entry is left as it is (a
// directory still gets its mode and time), one that holds from's is
// applied as Promote would, and one that holds neither is a conflict
// (ErrConflict, nothing written). Passing the snapshots the other way
// round undoes the promotion instead.
//
// litter, when not empty, is the process id of the promotion that
// stopped: its temporary entries (see tempName) beside each changed path
// are removed first. Every safety rule of Promote holds.
func (f *FS) PromoteResume(ctx context.Context, from, to SnapshotID, dir string, opts PromoteOptions, litter string) (*PromoteResult, error) {
	changes, err := f.DiffWith(ctx, from, to, opts.Diff)
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("resume promotion into %s: %w", dir, err)
	}
	defer unix.Close(root)
	h := &hostDir{fd: root, name: dir}
	if litter != "" && !opts.DryRun {
		if err := h.removeLitter(changes, ".tine-promote-"+litter+"-"); err != nil {
			return nil, err
		}
	}
	umask := processUmask()
	if opts.Umask != nil {
		umask = *opts.Umask
	}
	res := &PromoteResult{Changes: changes, Modes: make([]uint32, len(changes))}
	steps := make([]promoteStep, len(changes))
	deleted := map[string]bool{}
	fresh := map[string]bool{}
	for _, c := range changes {
		if c.Kind == Deleted {
			deleted[c.Path] = true
		}
		if c.New != nil && c.New.Type == TypeDir && (c.Old == nil || c.Old.Type != TypeDir) {
			fresh[c.Path] = true
		}
	}
	for i, c := range changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s := &steps[i]
		s.Change = c
		reason, err := f.checkHost(h, s, deleted, fresh)
		if err != nil {
			return nil, err
		}
		done := false
		if reason == "missing on the host" && c.Kind == TypeChanged && c.Old.Type == TypeDir {
			reason = "" // the directory was removed; its replacement is not in yet
		}
		if reason != "" {
			// Already applied? Compare with the new side instead.
			d := promoteStep{Change: Change{Path: c.Path, Kind: Modified, Old: c.New}}
			if c.New != nil && c.New.Type == TypeDir {
				d.Kind = ModeChanged
				d.Old = &Entry{Type: TypeDir, Mode: c.New.Mode}
			}
			r2, err := f.checkHost(h, &d, deleted, fresh)
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return nil, err
			}
			if r2 == "" || c.New != nil && c.New.Type == TypeDir && strings.HasPrefix(r2, "mode ") {
				done, reason = true, ""
				s.hostIno, s.onHost = d.hostIno, d.onHost
			}
		}
		if reason != "" {
			res.Conflicts = append(res.Conflicts, Conflict{Path: c.Path, Reason: reason + ", and it does not match the promotion's result either"})
		}
		if r := s.plan(opts.Privileges, umask); r != "" {
			res.Refused = append(res.Refused, Refusal{Path: c.Path, Reason: r})
		}
		if done {
			if c.New != nil && c.New.Type == TypeDir {
				// Made, but its mode and time may not be set yet.
				s.Kind, s.Old = ModeChanged, c.New
			} else {
				// Done: nothing to write, and no directory to check for it.
				s.skip, s.Kind = true, ModeChanged
			}
		}
		res.Modes[i] = s.mode
	}
	if len(res.Conflicts) > 0 {
		return res, fmt.Errorf("resume promotion into %s: %d path(s) match neither side, first %q (%s): %w",
			dir, len(res.Conflicts), res.Conflicts[0].Path, res.Conflicts[0].Reason, ErrConflict)
	}
	if res.Conflicts = f.precheck(h, steps, fresh); len(res.Conflicts) > 0 {
		return res, fmt.Errorf("resume promotion into %s: %d path(s) cannot be written, first %q (%s); nothing was written: %w",
			dir, len(res.Conflicts), res.Conflicts[0].Path, res.Conflicts[0].Reason, ErrCannotApply)
	}
	if opts.DryRun {
		return res, nil
	}
	if err := f.apply(ctx, h, steps); err != nil {
		return res, err
	}
	res.Applied = true
	return res, nil
}

// removeLitter removes the temporary entries whose names hold tag from
// the directories of the changed paths.
func (h *hostDir) removeLitter(changes []Change, tag string) error {
	seen := map[string]bool{}
	for _, c := range changes {
		p := parentOf(c.Path)
		if c.Path == "" || seen[p] {
			continue
		}
		seen[p] = true
		names, err := h.list(p)
		if err != nil {
			continue // not there (yet, or any more): nothing left in it
		}
		for _, n := range names {
			if strings.Contains(n, tag) {
				if err := h.remove(join(p, n), false); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
