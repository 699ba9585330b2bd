package cowfs

import (
	"context"
	"fmt"
	"io"
)

// DiffOptions narrows what DiffWith reports, and so what the patch, tar
// and promote consumers of a diff carry.
type DiffOptions struct {
	// GitInternals reports changes under any ".git" directory, and in any
	// directory laid out as a git repository (see isGitDir). They are
	// left out by default: a git command run inside a sandbox rewrites
	// .git/index and friends, which must never be promoted as files, and
	// a repository's config names commands that git runs (core.fsmonitor,
	// hooks) when someone runs git in that directory on the host.
	GitInternals bool
	// GitIgnore leaves out paths that the .gitignore files of the new
	// snapshot ignore.
	GitIgnore bool
}

// maxIgnoreFile bounds the .gitignore files DiffWith reads.
const maxIgnoreFile = 1 << 20

// DiffWith is Diff with the paths that opts excludes left out. A path is
// left out with everything below it: without GitInternals, any path with
// a component named ".git" (a repository's directory, or the file that
// points a worktree or submodule at one) and any directory the new
// snapshot has laid out as a git repository, whatever its name (a bare
// repository: git takes it for one when run inside it); with GitIgnore, any path that
// the .gitignore files of the new snapshot ignore, read with git's rules
// (see docs/export.md). A path is judged by its type in the new snapshot,
// or in the old one when it was deleted.
func (f *FS) DiffWith(ctx context.Context, a, b SnapshotID, opts DiffOptions) ([]Change, error) {
	var out []Change
	err := f.DiffEach(ctx, a, b, opts, func(c Change) error {
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DiffEach is DiffWith handing each change to fn as the walk finds it,
// in the same order, instead of collecting them: its memory follows the
// depth of the trees, not the size of the change. An error from fn ends
// the walk and is returned.
func (f *FS) DiffEach(ctx context.Context, a, b SnapshotID, opts DiffOptions, fn func(Change) error) error {
	ea, err := f.rootEntry(a)
	if err != nil {
		return err
	}
	eb, err := f.rootEntry(b)
	if err != nil {
		return err
	}
	d := &differ{f: f, ctx: ctx, emit: fn}
	var buf []bool
	if !opts.GitInternals || opts.GitIgnore {
		d.skip = func(dir *dirPair, p string, isDir bool, b *Entry) (bool, error) {
			if !opts.GitInternals && nameAt(p) == ".git" {
				return true, nil
			}
			if !opts.GitInternals && b != nil && b.Type == TypeDir {
				if git, err := f.isGitDir(b); err != nil || git {
					return git, err
				}
			}
			return opts.GitIgnore && dir.ign.ignored(p, isDir, &buf), nil
		}
	}
	if opts.GitIgnore {
		d.enter = func(_, dir *dirPair) error { return f.readIgnore(dir) }
	}
	return d.run(&ea, &eb)
}

// isGitDir reports whether directory e is laid out as a git repository's
// own directory, as git tells one: a HEAD (file or symlink), an objects
// directory and a refs directory in it.
func (f *FS) isGitDir(e *Entry) (bool, error) {
	es, err := f.getDir(e.ID)
	if err != nil {
		return false, err
	}
	var head, objects, refs bool
	for i := range es {
		switch c := &es[i]; c.Name {
		case "HEAD":
			head = c.Type == TypeFile || c.Type == TypeSymlink
		case "objects":
			objects = c.Type == TypeDir
		case "refs":
			refs = c.Type == TypeDir
		}
	}
	return head && objects && refs, nil
}

// nameAt is the last component of slash-separated path p.
func nameAt(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// readIgnore chains the rules of the .gitignore file in the new listing
// of dir, if it holds one, below the rules already in force.
func (f *FS) readIgnore(dir *dirPair) error {
	for i := range dir.bs {
		e := &dir.bs[i]
		if e.Name != ".gitignore" || e.Type != TypeFile {
			continue
		}
		name := join(dir.p, e.Name)
		if e.Size > maxIgnoreFile {
			return fmt.Errorf("%s is %d bytes, over the %d bytes a .gitignore may have; diff without the gitignore option, or shorten it", name, e.Size, maxIgnoreFile)
		}
		data, err := f.readSmall(e)
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		dir.ign = &ignoreDir{parent: dir.ign, base: dir.p, rules: parseIgnore(data)}
	}
	return nil
}

// readSmall reads the content of a file entry whose size the caller has
// already bounded.
func (f *FS) readSmall(e *Entry) ([]byte, error) {
	r, err := f.contentReader(e)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, e.Size)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("read file object %s: %w", e.ID, err)
	}
	return buf, nil
}
