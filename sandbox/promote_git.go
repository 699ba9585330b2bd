package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"tine/cowfs"
	"tine/internal/pathjson"
	"tine/internal/pathset"
	"tine/merge"
)

// GitPromoteOptions says how PromoteGit writes a sandbox's changes as a
// commit.
type GitPromoteOptions struct {
	// Branch is the new branch's name (refs/heads/Branch must not exist);
	// empty means the one a fork recorded (GitBase.Branch).
	Branch string
	// Message is the commit message (default: one naming the sandbox).
	Message string
	// Author is "Name <email>" (default: the repository's configured
	// identity, or tine's).
	Author string
	// Onto is a revision of the host repository to rebase the commit onto
	// with the three-way rules (e.g. "HEAD"); empty: the commit's parent is
	// the sandbox's GitBase.
	Onto string
	// KeepCommits keeps the commits the sandbox made in its own copy of
	// the repository, their objects copied in and checked.
	KeepCommits bool
	// DryRun builds the commit's tree and reports it; no branch is made.
	DryRun bool
	// Verify, when its Command is given, runs that check on a clean
	// checkout of the commit in a sandbox of its own first; no branch is
	// made unless it passes (see VerifyOptions).
	Verify VerifyOptions
}

// GitChange is one path the commit changes against its parent.
type GitChange struct {
	// Path is the path, invalid UTF-8 replaced; PathB64 holds its bytes
	// in base64 when they are not UTF-8 (JSON cannot carry them).
	Path    string `json:"path"`
	PathB64 string `json:"path_b64,omitempty"`
	// Status is A, M or D.
	Status string `json:"status"`
	// Mode is git's mode of the new entry (100644, 100755, 120000).
	Mode string `json:"mode,omitempty"`
}

// GitPromoteResult says what PromoteGit found and did.
type GitPromoteResult struct {
	// Repo is the host repository's work tree.
	Repo   string `json:"repo"`
	Branch string `json:"branch"`
	// Commit is the new branch's commit; Parent its first parent; Base
	// the commit the sandbox was made from.
	Commit string `json:"commit,omitempty"`
	Parent string `json:"parent,omitempty"`
	Base   string `json:"base"`
	// Onto is the commit the changes were rebased onto, if any.
	Onto    string      `json:"onto,omitempty"`
	Changes []GitChange `json:"changes"`
	// Refused lists sandbox paths git cannot hold or that were left out.
	Refused []cowfs.Refusal `json:"refused,omitempty"`
	// Merge and Merged are those of the three-way rebase (Onto).
	Merge  []MergeConflict `json:"merge_conflicts,omitempty"`
	Merged []string        `json:"merged,omitempty"`
	// Kept lists the sandbox's own commits kept (KeepCommits), oldest
	// first.
	Kept []string `json:"kept,omitempty"`
	// HostCommits counts the commits the host's HEAD gained since Base;
	// HostChanged the paths they changed (staleness, from git).
	HostCommits int      `json:"host_commits"`
	HostChanged []string `json:"host_changed,omitempty"`
	Applied     bool     `json:"applied"`
	// Verify is the check's outcome (Verify given); Record the file in
	// the state root that keeps it.
	Verify *VerifyResult `json:"verify,omitempty"`
	Record string        `json:"record,omitempty"`
}

// maxGitBlob bounds a file a git promote stores: git hash-object reads
// its input whole into memory, and a sandbox can make a file of a
// terabyte that takes no disk (a sparse one).
const maxGitBlob = 1 << 30

// Bounds on what --keep-commits copies out of a sandbox's .git.
const (
	maxKeepBytes   = 1 << 30
	maxKeepFiles   = 100_000
	maxKeepCommits = 10_000
	maxRefBytes    = 4 << 10
	maxPackedRefs  = 4 << 20
)

// ErrNoGitBase reports a sandbox that was not made from the top of a git
// work tree with a commit.
var ErrNoGitBase = errors.New("the sandbox does not record a git commit it was made from")

// PromoteGit writes the sandbox's project changes as one commit on a new
// branch of the host repository the sandbox was made from, using git
// plumbing only with hooks and every other configured program turned off:
// objects are written, a tree is built in a temporary index, the commit
// made and the branch created; the work tree, the index and HEAD are not
// touched. The commit's parent is the commit the sandbox was made from
// (GitBase), its tree that commit's with each path the sandbox changed
// set to the sandbox's content; .gitignored paths and anything under .git
// are left out. With Onto the tree is merged three ways onto that commit
// (the rules of Promote); with KeepCommits the sandbox's own commits come
// first.
func (m *Manager) PromoteGit(ctx context.Context, name string, o GitPromoteOptions) (*GitPromoteResult, error) {
	res, err := m.promoteGit(ctx, name, o)
	if o.Verify.Command == "" || res == nil {
		return res, err
	}
	rec := &PromoteRecord{Sandbox: name, Branch: res.Branch, Commit: res.Commit, DryRun: o.DryRun, Applied: res.Applied, Verify: res.Verify}
	if err != nil {
		rec.Error = err.Error()
	}
	if rerr := m.recordPromotion(rec); rerr != nil {
		return res, errors.Join(err, rerr)
	}
	res.Record = rec.Path
	return res, err
}

func (m *Manager) promoteGit(ctx context.Context, name string, o GitPromoteOptions) (*GitPromoteResult, error) {
	info, err := m.Get(name)
	if err != nil {
		return nil, err
	}
	gb := info.GitBase
	if gb.Commit == "" {
		return nil, fmt.Errorf("promote sandbox %q to a git branch: %w (its directory %s was not the top of a git work tree with a commit when it was made); promote into the directory instead (--to)", name, ErrNoGitBase, info.ProjectPath)
	}
	if o.Branch == "" {
		o.Branch = gb.Branch
	}
	if o.Branch == "" {
		return nil, fmt.Errorf("promote sandbox %q to a git branch: give the branch's name", name)
	}
	if o.KeepCommits && o.Onto != "" {
		return nil, fmt.Errorf("promote sandbox %q: --keep-commits and --onto together would rewrite the sandbox's commits; give one", name)
	}
	g := &gitRepo{dir: info.ProjectPath}
	res := &GitPromoteResult{Repo: g.dir, Branch: o.Branch, Base: gb.Commit, Changes: []GitChange{}}
	if strings.HasPrefix(o.Branch, "-") {
		return res, fmt.Errorf("promote sandbox %q: bad branch name %q", name, o.Branch)
	}
	ref := "refs/heads/" + o.Branch
	if _, err := g.out(ctx, nil, "check-ref-format", ref); err != nil {
		return res, fmt.Errorf("promote sandbox %q: bad branch name %q (see git check-ref-format)", name, o.Branch)
	}
	if _, err := g.rev(ctx, ref); err == nil {
		return res, fmt.Errorf("promote sandbox %q: branch %q already exists in %s; give a new name", name, o.Branch, g.dir)
	}
	if _, err := g.rev(ctx, gb.Commit); err != nil {
		return res, fmt.Errorf("promote sandbox %q: commit %s it was made from is not in %s any more: %w", name, gb.Commit, g.dir, err)
	}
	m.gitStaleness(ctx, g, gb.Commit, res)
	if err := g.identity(ctx, o.Author); err != nil {
		return res, fmt.Errorf("promote sandbox %q: %w", name, err)
	}
	theirs, err := m.projectSnapshot(ctx, name)
	if err != nil {
		return res, err
	}
	base, err := m.fs.Resolve(ctx, gb.FS)
	if err != nil {
		return res, fmt.Errorf("promote sandbox %q: the snapshot of its git base: %w", name, err)
	}
	tmp, err := os.MkdirTemp(m.root, ".git-promote-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	g.index = path.Join(tmp, "index")

	parent, start := gb.Commit, gb.Commit
	var extra []string // paths the sandbox committed, set to its content too
	if o.KeepCommits {
		head, err := m.keepCommits(ctx, g, theirs, gb.Commit, tmp, res)
		if err != nil {
			return res, fmt.Errorf("promote sandbox %q: keep its commits: %w", name, err)
		}
		if head != gb.Commit {
			parent, start = head, head
			if extra, err = g.changedPaths(ctx, gb.Commit, head); err != nil {
				return res, err
			}
		}
	}
	tree, err := m.gitTree(ctx, g, start, base, theirs, extra, res)
	if err != nil {
		return res, fmt.Errorf("promote sandbox %q: %w", name, err)
	}
	if o.Onto != "" {
		onto, err := g.rev(ctx, o.Onto)
		if err != nil {
			return res, fmt.Errorf("promote sandbox %q: --onto %q is not a commit of %s", name, o.Onto, g.dir)
		}
		res.Onto = onto
		if onto != gb.Commit {
			if tree, err = m.gitRebase(ctx, g, gb.Commit, tree, onto, res); err != nil {
				return res, fmt.Errorf("promote sandbox %q: %w", name, err)
			}
			if len(res.Merge) > 0 {
				c := res.Merge[0]
				return res, fmt.Errorf("promote sandbox %q onto %s: %d path(s) changed on both sides, first %q (%s); no branch was made: %w", name, o.Onto, len(res.Merge), c.Path, c.Reason, ErrMergeConflict)
			}
		}
		parent = onto
	}
	res.Parent = parent
	if res.Changes, err = g.treeChanges(ctx, parent, tree); err != nil {
		return res, err
	}
	ptree, err := g.line(ctx, nil, "rev-parse", "--verify", parent+"^{tree}")
	if err != nil {
		return res, err
	}
	commit := parent
	if tree != ptree || len(res.Kept) == 0 {
		msg := o.Message
		if msg == "" {
			msg = fmt.Sprintf("changes of sandbox %s\n", name)
			if len(res.Kept) > 0 {
				msg = fmt.Sprintf("changes of sandbox %s not committed in it\n", name)
			}
		}
		if commit, err = g.line(ctx, strings.NewReader(msg), "commit-tree", "--no-gpg-sign", tree, "-p", parent, "-F", "-"); err != nil {
			return res, fmt.Errorf("promote sandbox %q: %w", name, err)
		}
	}
	res.Commit = commit
	if o.Verify.Command != "" {
		tree, err := m.commitSnapshot(ctx, g, commit, tmp)
		if err != nil {
			return res, fmt.Errorf("promote sandbox %q: %w", name, err)
		}
		if res.Verify, err = m.verify(ctx, info, tree, o.Verify); err != nil {
			return res, fmt.Errorf("promote sandbox %q to branch %q: no branch was made: %w", name, o.Branch, err)
		}
	}
	if o.DryRun {
		return res, nil
	}
	if _, err := g.out(ctx, nil, "update-ref", "-m", "tine promote "+name, "--create-reflog", ref, commit, ""); err != nil {
		return res, fmt.Errorf("promote sandbox %q: create branch %q: %w", name, o.Branch, err)
	}
	res.Applied = true
	return res, nil
}

// identity sets the commit's author and committer: author as given
// ("Name <email>"), else the repository's configured identity, else
// tine's own.
func (g *gitRepo) identity(ctx context.Context, author string) error {
	if author != "" {
		n, rest, ok := strings.Cut(author, "<")
		email, _, ok2 := strings.Cut(rest, ">")
		n = strings.TrimSpace(n)
		if !ok || !ok2 || n == "" || strings.ContainsAny(author, "\n\x00") {
			return fmt.Errorf("bad author %q (want \"Name <email>\")", author)
		}
		g.env = append(g.env, "GIT_AUTHOR_NAME="+n, "GIT_AUTHOR_EMAIL="+email)
		if _, err := g.out(ctx, nil, "var", "GIT_COMMITTER_IDENT"); err != nil {
			g.env = append(g.env, "GIT_COMMITTER_NAME="+n, "GIT_COMMITTER_EMAIL="+email)
		}
		return nil
	}
	if _, err := g.out(ctx, nil, "var", "GIT_AUTHOR_IDENT"); err != nil {
		g.env = append(g.env, "GIT_AUTHOR_NAME=tine", "GIT_AUTHOR_EMAIL=tine@localhost",
			"GIT_COMMITTER_NAME=tine", "GIT_COMMITTER_EMAIL=tine@localhost")
	}
	return nil
}

// gitStaleness fills in how far the host's HEAD moved since base.
func (m *Manager) gitStaleness(ctx context.Context, g *gitRepo, base string, res *GitPromoteResult) {
	head, err := g.rev(ctx, "HEAD")
	if err != nil || head == base {
		return
	}
	if n, err := g.line(ctx, nil, "rev-list", "--count", base+".."+head); err == nil {
		fmt.Sscan(n, &res.HostCommits)
	}
	if ps, err := g.changedPaths(ctx, base, head); err == nil {
		res.HostChanged = ps
	}
}

// changedPaths lists the paths that differ between commits a and b.
func (g *gitRepo) changedPaths(ctx context.Context, a, b string) ([]string, error) {
	o, err := g.out(ctx, nil, "diff-tree", "-r", "-z", "--no-renames", "--name-only", a, b)
	if err != nil {
		return nil, err
	}
	var ps []string
	for _, p := range strings.Split(string(o), "\x00") {
		if p != "" {
			ps = append(ps, p)
		}
	}
	return ps, nil
}

// treeChanges lists what tree changes against commit parent.
func (g *gitRepo) treeChanges(ctx context.Context, parent, tree string) ([]GitChange, error) {
	rs, err := g.rawDiff(ctx, parent, tree)
	if err != nil {
		return nil, err
	}
	out := []GitChange{}
	for _, r := range rs {
		c := GitChange{Path: strings.ToValidUTF8(r.path, "\uFFFD"), PathB64: pathjson.B64(r.path), Status: r.status}
		if r.status != "D" {
			c.Mode = r.newMode
		}
		out = append(out, c)
	}
	return out, nil
}

// rawEntry is one line of git diff-tree --raw.
type rawEntry struct {
	oldMode, newMode, oldID, newID, status, path string
}

// rawDiff runs diff-tree -r between two tree-ish.
func (g *gitRepo) rawDiff(ctx context.Context, a, b string) ([]rawEntry, error) {
	o, err := g.out(ctx, nil, "diff-tree", "-r", "-z", "--no-renames", "--raw", "--full-index", a, b)
	if err != nil {
		return nil, err
	}
	parts := strings.Split(string(o), "\x00")
	var rs []rawEntry
	for i := 0; i+1 < len(parts); i += 2 {
		f := strings.Fields(strings.TrimPrefix(parts[i], ":"))
		if len(f) != 5 {
			return nil, fmt.Errorf("git diff-tree: unexpected line %q", parts[i])
		}
		rs = append(rs, rawEntry{f[0], f[1], f[2], f[3], f[4][:1], parts[i+1]})
	}
	return rs, nil
}

// gitTree builds, in the temporary index, the tree of commit start with
// each path changed from snapshot base to theirs (and each of extra) set
// to theirs' content, and returns it.
func (m *Manager) gitTree(ctx context.Context, g *gitRepo, start string, base, theirs cowfs.SnapshotID, extra []string, res *GitPromoteResult) (string, error) {
	if _, err := g.out(ctx, nil, "read-tree", start); err != nil {
		return "", err
	}
	changes, err := m.fs.DiffWith(ctx, base, theirs, cowfs.DiffOptions{GitIgnore: true})
	if err != nil {
		return "", err
	}
	set := map[string]*cowfs.Entry{}
	var order []string
	for i := range changes {
		c := &changes[i]
		if c.Old != nil && c.Old.Type != cowfs.TypeDir {
			if _, ok := set[c.Path]; !ok {
				order = append(order, c.Path)
			}
			set[c.Path] = nil
		}
		if c.New != nil && c.New.Type != cowfs.TypeDir {
			if _, ok := set[c.Path]; !ok {
				order = append(order, c.Path)
			}
			set[c.Path] = c.New
		}
	}
	for _, p := range extra {
		if _, ok := set[p]; ok {
			continue
		}
		e, err := m.lookup(ctx, theirs, p)
		if err != nil {
			return "", err
		}
		if e != nil && e.Type == cowfs.TypeDir {
			e = nil
		}
		order = append(order, p)
		set[p] = e
	}
	// Entries under a directory the sandbox removed or replaced go from
	// the index too.
	var gone pathset.Set
	for p := range set {
		gone.Add(p)
	}
	for _, c := range changes {
		if c.Old != nil && c.Old.Type == cowfs.TypeDir && (c.New == nil || c.New.Type != cowfs.TypeDir) {
			gone.Add(c.Path)
		}
	}
	listed, err := g.out(ctx, nil, "ls-files", "-z", "--cached")
	if err != nil {
		return "", err
	}
	var info bytes.Buffer
	zero := strings.Repeat("0", 40)
	if len(start) == 64 {
		zero = strings.Repeat("0", 64)
	}
	for _, p := range strings.Split(string(listed), "\x00") {
		if p == "" {
			continue
		}
		if _, ok := set[p]; !ok && gone.HasAbove(p) {
			fmt.Fprintf(&info, "0 %s\t%s\x00", zero, p)
		}
	}
	sort.Strings(order)
	for _, p := range order {
		e := set[p]
		if bad := gitRefusedPath(p); bad != "" {
			res.Refused = append(res.Refused, cowfs.Refusal{Path: p, Reason: bad})
			continue
		}
		if e == nil {
			fmt.Fprintf(&info, "0 %s\t%s\x00", zero, p)
			continue
		}
		mode := "100644"
		switch {
		case e.Type == cowfs.TypeSymlink:
			mode = "120000"
		case e.Type != cowfs.TypeFile:
			res.Refused = append(res.Refused, cowfs.Refusal{Path: p, Reason: fmt.Sprintf("a %s: git holds only files and symlinks", e.Type)})
			continue
		case e.Size > maxGitBlob:
			res.Refused = append(res.Refused, cowfs.Refusal{Path: p, Reason: fmt.Sprintf(
				"a file of %d bytes: over the %d bytes a git promote stores (git reads a blob whole into memory); promote into the directory for it", e.Size, int64(maxGitBlob))})
			continue
		case e.Mode&0o111 != 0:
			mode = "100755"
		}
		r, err := m.fs.OpenFileData(ctx, e)
		if err != nil {
			return "", fmt.Errorf("read %q: %w", p, err)
		}
		id, err := g.line(ctx, r, "hash-object", "-w", "--no-filters", "--stdin")
		if err != nil {
			return "", fmt.Errorf("store %q: %w", p, err)
		}
		fmt.Fprintf(&info, "%s %s\t%s\x00", mode, id, p)
	}
	if _, err := g.out(ctx, &info, "update-index", "-z", "--index-info"); err != nil {
		return "", err
	}
	return g.line(ctx, nil, "write-tree")
}

// gitRefusedPath says why git must not be given path p ("" if it may).
func gitRefusedPath(p string) string {
	for _, c := range strings.Split(p, "/") {
		if strings.EqualFold(c, ".git") || strings.HasPrefix(strings.ToLower(c), ".git ") || strings.HasPrefix(strings.ToLower(c), "git~") {
			return "a path component git reserves (.git)"
		}
	}
	if strings.ContainsAny(p, "\x00") {
		return "a NUL byte in the name"
	}
	return ""
}

// lookup returns the entry at slash-separated path p of snapshot snap
// (nil when absent).
func (m *Manager) lookup(ctx context.Context, snap cowfs.SnapshotID, p string) (*cowfs.Entry, error) {
	e, err := m.fs.TopEntry(ctx, snap)
	if err != nil {
		return nil, err
	}
	for _, name := range strings.Split(p, "/") {
		if e.Type != cowfs.TypeDir {
			return nil, nil
		}
		ents, err := m.fs.ReadDirEntry(ctx, &e)
		if err != nil {
			return nil, err
		}
		i := sort.Search(len(ents), func(i int) bool { return ents[i].Name >= name })
		if i == len(ents) || ents[i].Name != name {
			return nil, nil
		}
		e = ents[i]
	}
	return &e, nil
}

// gitRebase merges the change from commit base to tree theirs onto commit
// onto, three ways with Promote's rules, and returns the merged tree;
// clashes go to res.Merge.
func (m *Manager) gitRebase(ctx context.Context, g *gitRepo, base, theirs, onto string, res *GitPromoteResult) (string, error) {
	dT, err := g.rawDiff(ctx, base, theirs)
	if err != nil {
		return "", err
	}
	dO, err := g.rawDiff(ctx, base, onto)
	if err != nil {
		return "", err
	}
	host := map[string]*rawEntry{}
	var hostAdded pathset.Set // what the host has now, of what it changed
	for i := range dO {
		host[dO[i].path] = &dO[i]
		if dO[i].status != "D" {
			hostAdded.Add(dO[i].path)
		}
	}
	clash := func(p, why, ours, theirs string, h []merge.Conflict) {
		res.Merge = append(res.Merge, MergeConflict{Path: p, Reason: why, Ours: ours, Theirs: theirs, Hunks: h})
	}
	kind := map[string]string{"A": "added", "M": "modified", "D": "deleted", "T": "type-changed"}
	if _, err := g.out(ctx, nil, "read-tree", onto); err != nil {
		return "", err
	}
	var info bytes.Buffer
	for _, t := range dT {
		h := host[t.path]
		above := ""
		hostAdded.Above(t.path, func(a string) bool { above = a; return false })
		switch {
		case above != "":
			clash(t.path, fmt.Sprintf("the host made %q a file above it", above), "added above", kind[t.status], nil)
		case t.status != "D" && hostAdded.HasBelow(t.path):
			clash(t.path, "the host added files below it", "added below", kind[t.status], nil)
		case h == nil:
			fmt.Fprintf(&info, "%s %s\t%s\x00", t.newMode, t.newID, t.path)
		case h.newMode == t.newMode && h.newID == t.newID:
			// The same change on both sides.
		case t.oldMode != "000000" && isBlob(t.oldMode) && isBlob(h.newMode) && isBlob(t.newMode):
			id, hunks, why, err := m.mergeBlobs(ctx, g, t.oldID, h.newID, t.newID)
			if err != nil {
				return "", fmt.Errorf("merge %q: %w", t.path, err)
			}
			if why != "" {
				clash(t.path, why, kind[h.status], kind[t.status], hunks)
				continue
			}
			mode := h.newMode
			if t.newMode != t.oldMode {
				mode = t.newMode
			}
			res.Merged = append(res.Merged, t.path)
			fmt.Fprintf(&info, "%s %s\t%s\x00", mode, id, t.path)
		default:
			clash(t.path, fmt.Sprintf("%s on the host, %s in the sandbox", kind[h.status], kind[t.status]), kind[h.status], kind[t.status], nil)
		}
	}
	if len(res.Merge) > 0 {
		return "", nil
	}
	if _, err := g.out(ctx, &info, "update-index", "-z", "--index-info"); err != nil {
		return "", err
	}
	return g.line(ctx, nil, "write-tree")
}

func isBlob(mode string) bool { return mode == "100644" || mode == "100755" }

// mergeBlobs merges three text blobs line by line; it returns the merged
// blob, or why it cannot (with the clashing hunks).
func (m *Manager) mergeBlobs(ctx context.Context, g *gitRepo, b, o, t string) (string, []merge.Conflict, string, error) {
	var data [3][]byte
	for i, id := range []string{b, o, t} {
		sz, err := g.line(ctx, nil, "cat-file", "-s", id)
		if err != nil {
			return "", nil, "", err
		}
		var n int64
		fmt.Sscan(sz, &n)
		if n > maxMergeBytes {
			return "", nil, fmt.Sprintf("changed on both sides, and larger than %d bytes: not merged line by line", maxMergeBytes), nil
		}
		if data[i], err = g.out(ctx, nil, "cat-file", "blob", id); err != nil {
			return "", nil, "", err
		}
		if merge.Binary(data[i]) {
			return "", nil, "binary file changed on both sides", nil
		}
	}
	r, err := merge.Merge(data[0], data[1], data[2])
	if errors.Is(err, merge.ErrTooLarge) {
		return "", nil, "changed on both sides, " + err.Error(), nil
	} else if err != nil {
		return "", nil, "", err
	}
	if len(r.Conflicts) > 0 {
		return "", r.Conflicts, fmt.Sprintf("%d region(s) changed differently on both sides, first at line %d of the host's file", len(r.Conflicts), r.Conflicts[0].OursStart), nil
	}
	id, err := g.line(ctx, bytes.NewReader(r.Merged), "hash-object", "-w", "--no-filters", "--stdin")
	return id, nil, "", err
}
