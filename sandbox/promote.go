package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"time"

	"tine/cowfs"
	"tine/internal/pathjson"
	"tine/internal/pathset"
	"tine/merge"
)

// PromoteOptions says how Promote applies a sandbox's changes.
type PromoteOptions struct {
	cowfs.PromoteOptions
	// To is the host directory to promote into; empty means the one the
	// sandbox was made from (ProjectPath).
	To string
	// Partial applies the changes that merge cleanly when others
	// conflict; the conflicting paths are left as the host has them.
	Partial bool
	// Verify, when its Command is given, runs that check on the merged
	// result in a sandbox of its own first; nothing is written unless it
	// passes (see VerifyOptions).
	Verify VerifyOptions
}

// MergeConflict is a path changed both on the host and in the sandbox in
// ways that cannot be combined.
type MergeConflict struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
	// Ours is the host's change since the base ("modified", "deleted",
	// ...), Theirs the sandbox's.
	Ours   string `json:"ours"`
	Theirs string `json:"theirs"`
	// Hunks are the clashing line ranges of a text file, both sides given.
	Hunks []merge.Conflict `json:"hunks,omitempty"`
}

// mergeConflictJSON is MergeConflict without its JSON methods.
type mergeConflictJSON MergeConflict

// MarshalJSON writes the path's exact bytes in path_b64 when they are not
// UTF-8 (package pathjson).
func (c MergeConflict) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		mergeConflictJSON
		PathB64 string `json:"path_b64,omitempty"`
	}{mergeConflictJSON(c), pathjson.B64(c.Path)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *MergeConflict) UnmarshalJSON(b []byte) error {
	var j struct {
		mergeConflictJSON
		PathB64 string `json:"path_b64,omitempty"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = MergeConflict(j.mergeConflictJSON)
	c.Path = pathjson.Exact(c.Path, j.PathB64)
	return nil
}

// PromoteResult says what a promotion found and did.
type PromoteResult struct {
	// Changes, Modes, Conflicts (the host moved during the promotion or
	// cannot take a write), Refused and Applied are those of the apply
	// step: the changes from the host as it is to the merged result.
	*cowfs.PromoteResult
	// Merge lists the paths where the host's and the sandbox's changes
	// clash; nothing is written when there is one, unless Partial.
	Merge []MergeConflict `json:"merge_conflicts,omitempty"`
	// Merged lists the text files whose changes on both sides were
	// combined line by line.
	Merged []string `json:"merged,omitempty"`
	// HostChanged counts the paths the host changed since the sandbox's
	// base (staleness); HostExamples names a few.
	HostChanged  int      `json:"host_changed"`
	HostExamples []string `json:"host_examples,omitempty"`
	// Dir is the host directory promoted into.
	Dir string `json:"dir"`
	// Verify is the check's outcome (Verify given); Record the file in
	// the state root that keeps it.
	Verify *VerifyResult `json:"verify,omitempty"`
	Record string        `json:"record,omitempty"`
}

// ErrMergeConflict reports changes on the host and in the sandbox that
// clash; it wraps cowfs.ErrConflict.
var ErrMergeConflict = fmt.Errorf("changes clash with the host's: %w", cowfs.ErrConflict)

// maxMergeBytes is the largest file merged line by line; larger ones
// changed on both sides are conflicts.
const maxMergeBytes = 8 << 20

// Promote merges the sandbox's project changes into a host directory, three
// ways: the base is the host directory as the sandbox started from it
// (HostBase), ours the directory as it is now, theirs the sandbox now
// (taken with it frozen). Changes that do not overlap are applied even
// if the host moved; a text file changed on both sides is merged line by
// line; anything else changed on both sides is a conflict, and with any
// conflict nothing is written unless o.Partial. The apply is that of
// cowfs.Promote (every safety rule, each entry renamed into place) with
// a journal in the state root, so that a crash leaves a promotion that
// ResumePromote or AbortPromote finishes. Once applied in full, HostBase
// becomes the sandbox's snapshot, so the next promotion carries only what
// changed since.
func (m *Manager) Promote(ctx context.Context, name string, o PromoteOptions) (res *PromoteResult, err error) {
	info, err := m.Get(name)
	if err != nil {
		return nil, err
	}
	if info.HostBase == "" {
		return nil, fmt.Errorf("promote sandbox %q: it was made from snapshot %s, which does not record the host directory it came from; export its changes instead (Diff)", name, info.From)
	}
	dir := o.To
	if dir == "" {
		dir = info.ProjectPath
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	done, err := m.claimPromotion(name, dir)
	if err != nil {
		return nil, err
	}
	defer done()
	if j, _ := m.readJournal(name); j != nil {
		return nil, fmt.Errorf("promote sandbox %q: a promotion into %s stopped partway (started %s); finish it with `tine promote --resume %s` or undo it with `tine promote --abort %s`", name, j.Dir, j.Started.Format(time.RFC3339), name, name)
	}
	base, err := m.fs.Resolve(ctx, info.HostBase)
	if err != nil {
		return nil, fmt.Errorf("promote sandbox %q: its host base: %w", name, err)
	}
	theirs, err := m.projectSnapshot(ctx, name)
	if err != nil {
		return nil, err
	}
	ours, err := m.fs.Import(ctx, dir, "")
	if err != nil {
		return nil, fmt.Errorf("promote sandbox %q: read %s: %w", name, dir, err)
	}
	res, merged, err := m.mergeInto(ctx, name, dir, base, ours, theirs, o)
	if o.Verify.Command != "" {
		defer func() {
			rec := &PromoteRecord{Sandbox: name, Dir: dir, DryRun: o.DryRun, Applied: applied(res), Verify: res.Verify}
			if err != nil {
				rec.Error = err.Error()
			}
			if rerr := m.recordPromotion(rec); rerr != nil {
				err = errors.Join(err, rerr)
			} else {
				res.Record = rec.Path
			}
		}()
	}
	if err != nil || merged == nil {
		return res, err
	}
	if o.Verify.Command != "" {
		if res.Verify, err = m.verify(ctx, info, *merged, o.Verify); err != nil {
			return res, fmt.Errorf("promote sandbox %q into %s: nothing was written: %w", name, dir, err)
		}
	}
	err = m.applyMerged(ctx, info, res, &journal{Sandbox: name, Dir: dir, Ours: ours.String(), Merged: merged.String(),
		Theirs: theirs.String(), Partial: len(res.Merge) > 0, Privileges: o.Privileges, Umask: o.Umask}, o)
	return res, err
}

// ErrPromoting reports a promotion refused because another one of the
// same sandbox, or into the same directory, is under way: two at once
// would share one journal, or each merge against a host the other is
// changing.
var ErrPromoting = errors.New("another promotion is under way")

// claimPromotion marks a promotion of sandbox name into dir as under way
// until the function it returns is called, or fails with ErrPromoting.
func (m *Manager) claimPromotion(name, dir string) (func(), error) {
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	sb, d := "sandbox "+name, "directory "+dir
	m.ext.mu.Lock()
	defer m.ext.mu.Unlock()
	switch {
	case m.ext.promoting[sb]:
		return nil, fmt.Errorf("promote sandbox %q: %w (of this sandbox); wait for it to end", name, ErrPromoting)
	case m.ext.promoting[d]:
		return nil, fmt.Errorf("promote sandbox %q into %s: %w (into that directory); wait for it to end", name, dir, ErrPromoting)
	}
	if m.ext.promoting == nil {
		m.ext.promoting = map[string]bool{}
	}
	m.ext.promoting[sb], m.ext.promoting[d] = true, true
	return func() {
		m.ext.mu.Lock()
		defer m.ext.mu.Unlock()
		delete(m.ext.promoting, sb)
		delete(m.ext.promoting, d)
	}, nil
}

// applied reports whether promotion r wrote its changes.
func applied(r *PromoteResult) bool {
	return r != nil && r.PromoteResult != nil && r.PromoteResult.Applied
}

// projectSnapshot takes a snapshot of the sandbox's project with it
// frozen.
func (m *Manager) projectSnapshot(ctx context.Context, name string) (cowfs.SnapshotID, error) {
	info, err := m.Get(name)
	if err != nil {
		return cowfs.SnapshotID{}, err
	}
	var snap cowfs.SnapshotID
	err = m.freezeWhile(ctx, name, func() error {
		var err error
		snap, err = m.fs.Snapshot(ctx, info.Branch)
		return err
	})
	if err != nil {
		return snap, fmt.Errorf("promote sandbox %q: snapshot the project: %w", name, err)
	}
	return snap, nil
}

// mergeInto merges base→theirs into ours and returns the merged snapshot
// (nil when nothing is to be written: conflicts without Partial, or
// nothing to do).
func (m *Manager) mergeInto(ctx context.Context, name, dir string, base, ours, theirs cowfs.SnapshotID, o PromoteOptions) (*PromoteResult, *cowfs.SnapshotID, error) {
	res := &PromoteResult{PromoteResult: &cowfs.PromoteResult{}, Dir: dir}
	edits, err := m.merge3(ctx, res, base, ours, theirs, o.Diff)
	if err != nil {
		return res, nil, fmt.Errorf("promote sandbox %q: %w", name, err)
	}
	if len(res.Merge) > 0 && !o.Partial {
		c := res.Merge[0]
		return res, nil, fmt.Errorf("promote sandbox %q into %s: %d path(s) changed on both sides, first %q (%s); nothing was written (resolve them, or give --partial to apply the rest): %w",
			name, dir, len(res.Merge), c.Path, c.Reason, ErrMergeConflict)
	}
	merged, err := m.fs.EditSnapshot(ctx, ours, edits)
	if err != nil {
		return res, nil, fmt.Errorf("promote sandbox %q: build the merged tree: %w", name, err)
	}
	return res, &merged, nil
}

// applyMerged checks and (unless a dry run) applies the merged snapshot
// to the host directory under a journal.
func (m *Manager) applyMerged(ctx context.Context, info *Info, res *PromoteResult, j *journal, o PromoteOptions) error {
	ours, _ := m.fs.Resolve(ctx, j.Ours)
	merged, _ := m.fs.Resolve(ctx, j.Merged)
	po := o.PromoteOptions
	po.Diff = cowfs.DiffOptions{GitInternals: true}
	if !po.DryRun {
		if err := m.writeJournal(j); err != nil {
			return fmt.Errorf("promote sandbox %q: %w", info.Name, err)
		}
	}
	cres, err := m.fs.Promote(ctx, ours, merged, j.Dir, po)
	if cres != nil {
		res.PromoteResult = cres
	}
	if po.DryRun || err != nil && !cres.Applied && (errors.Is(err, cowfs.ErrConflict) || errors.Is(err, cowfs.ErrCannotApply)) {
		// Nothing was written.
		m.dropJournal(ctx, j)
		if err != nil {
			return fmt.Errorf("promote sandbox %q: %w", info.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("promote sandbox %q: stopped partway: %w; finish with `tine promote --resume %s` or undo with `tine promote --abort %s`", info.Name, err, info.Name, info.Name)
	}
	return m.finishPromote(ctx, j)
}

// finishPromote records a completed promotion and drops its journal.
func (m *Manager) finishPromote(ctx context.Context, j *journal) error {
	if !j.Partial {
		info, err := m.Get(j.Sandbox)
		if err != nil {
			return err
		}
		info.HostBase = j.Theirs
		if err := m.save(info); err != nil {
			return fmt.Errorf("promote sandbox %q: applied, but recording the new base failed (the next promotion merges again): %w", j.Sandbox, err)
		}
	}
	m.audit(j.Sandbox, "promote", map[string]any{"to": j.Dir, "partial": j.Partial, "snapshot": j.Merged})
	m.dropJournal(ctx, j)
	return nil
}

// merge3 compares both sides' changes from base, fills res.Merge,
// res.Merged and the host's staleness, and returns the edits that turn
// ours into the merged tree.
func (m *Manager) merge3(ctx context.Context, res *PromoteResult, base, ours, theirs cowfs.SnapshotID, filter cowfs.DiffOptions) ([]cowfs.TreeEdit, error) {
	dT, err := m.fs.DiffWith(ctx, base, theirs, filter)
	if err != nil {
		return nil, err
	}
	dO, err := m.fs.DiffWith(ctx, base, ours, cowfs.DiffOptions{GitInternals: true})
	if err != nil {
		return nil, err
	}
	res.HostChanged = len(dO)
	// Each side's changes by path, and what each removed or replaced, for
	// the checks of the paths below.
	var sandGone, hostGone, bad pathset.Set
	host := make(map[string]*cowfs.Change, len(dO))
	for i := range dO {
		host[dO[i].Path] = &dO[i]
		if len(res.HostExamples) < staleExamples {
			res.HostExamples = append(res.HostExamples, dO[i].Path)
		}
		if h := dO[i].New; h == nil || h.Type != cowfs.TypeDir {
			hostGone.Add(dO[i].Path)
		}
	}
	sand := make(map[string]*cowfs.Change, len(dT))
	for i := range dT {
		sand[dT[i].Path] = &dT[i]
		if k := dT[i].Kind; k == cowfs.Deleted || k == cowfs.TypeChanged {
			sandGone.Add(dT[i].Path)
		}
	}
	clash := func(p, reason, ours, theirs string, hunks []merge.Conflict) {
		if !bad.Has(p) {
			bad.Add(p)
			res.Merge = append(res.Merge, MergeConflict{Path: p, Reason: reason, Ours: ours, Theirs: theirs, Hunks: hunks})
		}
	}
	// The host changed something inside a directory the sandbox removed or
	// replaced.
	for _, h := range dO {
		sandGone.Above(h.Path, func(a string) bool {
			c := sand[a]
			clash(a, fmt.Sprintf("the sandbox %s it; the host changed %q inside it", verb(c.Kind), h.Path), "changed inside", c.Kind.String(), nil)
			return true
		})
	}
	var edits []cowfs.TreeEdit
	for i := range dT {
		c := &dT[i]
		// The host removed or replaced a directory above it (the lowest
		// one is named).
		var h *cowfs.Change
		above := ""
		hostGone.Above(c.Path, func(a string) bool { h, above = host[a], a; return true })
		if h != nil {
			clash(c.Path, fmt.Sprintf("the host %s %q above it", verb(h.Kind), above), h.Kind.String()+" above", c.Kind.String(), nil)
		}
		if bad.Has(c.Path) {
			continue
		}
		h = host[c.Path]
		switch {
		case h == nil:
			edits = append(edits, editFor(c.Path, c.New))
		case h.New == nil && c.New == nil:
			// Removed on both sides.
		case h.New != nil && c.New != nil && h.New.Type == cowfs.TypeDir && c.New.Type == cowfs.TypeDir:
			edits = append(edits, editFor(c.Path, c.New)) // contents merge path by path
		case h.New != nil && c.New != nil && sameEntry(h.New, c.New):
			// The same change on both sides.
		case c.Old != nil && h.New != nil && c.New != nil && c.Old.Type == cowfs.TypeFile && h.New.Type == cowfs.TypeFile && c.New.Type == cowfs.TypeFile:
			e, hunks, why, err := m.mergeFile(ctx, c.Old, h.New, c.New)
			if err != nil {
				return nil, fmt.Errorf("merge %q: %w", c.Path, err)
			}
			if why != "" {
				clash(c.Path, why, h.Kind.String(), c.Kind.String(), hunks)
				continue
			}
			res.Merged = append(res.Merged, c.Path)
			edits = append(edits, cowfs.TreeEdit{Path: c.Path, Entry: e})
		default:
			clash(c.Path, fmt.Sprintf("%s on the host, %s in the sandbox", h.Kind, c.Kind), h.Kind.String(), c.Kind.String(), nil)
		}
	}
	if bad.Empty() {
		return edits, nil
	}
	// With Partial: leave out whatever is at or below a conflict.
	kept := edits[:0]
	for _, e := range edits {
		if !bad.Within(e.Path) {
			kept = append(kept, e)
		}
	}
	return kept, nil
}

// mergeFile merges a text file changed on both sides. It returns the
// merged entry, or the reason it cannot (with the clashing hunks).
func (m *Manager) mergeFile(ctx context.Context, b, o, t *cowfs.Entry) (*cowfs.Entry, []merge.Conflict, string, error) {
	if b.Size > maxMergeBytes || o.Size > maxMergeBytes || t.Size > maxMergeBytes {
		return nil, nil, fmt.Sprintf("changed on both sides, and larger than %d bytes: not merged line by line", maxMergeBytes), nil
	}
	var data [3][]byte
	for i, e := range []*cowfs.Entry{b, o, t} {
		var err error
		if data[i], err = m.fs.ReadFileData(ctx, e, maxMergeBytes); err != nil {
			return nil, nil, "", err
		}
		if merge.Binary(data[i]) {
			return nil, nil, "binary file changed on both sides", nil
		}
	}
	r, err := merge.Merge(data[0], data[1], data[2])
	if errors.Is(err, merge.ErrTooLarge) {
		return nil, nil, "changed on both sides, " + err.Error(), nil
	} else if err != nil {
		return nil, nil, "", err
	}
	if len(r.Conflicts) > 0 {
		return nil, r.Conflicts, fmt.Sprintf("%d region(s) changed differently on both sides, first at line %d of the host's file", len(r.Conflicts), r.Conflicts[0].OursStart), nil
	}
	meta := *o
	if t.Mode != b.Mode {
		meta.Mode = t.Mode
	}
	meta.MtimeNs = time.Now().UnixNano()
	e, err := m.fs.PutFileData(ctx, r.Merged, meta)
	return &e, nil, "", err
}

// editFor is the edit that gives path p the sandbox's entry e (nil:
// removed). A directory keeps the contents the host has; its own
// entries are edited one by one.
func editFor(p string, e *cowfs.Entry) cowfs.TreeEdit {
	if e == nil {
		return cowfs.TreeEdit{Path: p}
	}
	c := *e
	if c.Type == cowfs.TypeDir {
		c.ID = cowfs.SnapshotID{}
	}
	// Hard-link groups are not carried across trees.
	c.LinkID, c.Nlink = 0, 1
	return cowfs.TreeEdit{Path: p, Entry: &c}
}

// sameEntry reports whether two entries hold the same thing.
func sameEntry(a, b *cowfs.Entry) bool {
	return a.Type == b.Type && a.ID == b.ID && a.Size == b.Size && a.Target == b.Target && a.Rdev == b.Rdev && a.Mode == b.Mode
}

func verb(k cowfs.ChangeKind) string {
	switch k {
	case cowfs.Deleted:
		return "removed"
	case cowfs.TypeChanged:
		return "replaced"
	}
	return k.String()
}
