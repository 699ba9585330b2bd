package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/spf13/pflag"

	"tine/cowfs"
	"tine/internal/pathjson"
)

func resolvePair(ctx context.Context, f *cowfs.FS, pos []string) (cowfs.SnapshotID, cowfs.SnapshotID, error) {
	a, err := resolve(ctx, f, pos[0])
	if err != nil {
		return a, a, err
	}
	b, err := resolve(ctx, f, pos[1])
	return a, b, err
}

// diffFlags registers the flags that choose which changes a diff, patch
// or export carries.
func diffFlags(fs *pflag.FlagSet, o *fsOpts) {
	fs.BoolVar(&o.diff.GitInternals, "include-git-internals", false, "include paths under .git (left out by default)")
	fs.BoolVar(&o.diff.GitIgnore, "gitignore", false, "leave out paths the new snapshot's .gitignore files ignore")
}

func patchFlags(fs *pflag.FlagSet, o *fsOpts) {
	diffFlags(fs, o)
	fs.Int64Var(&o.maxFile, "max-file", cowfs.DefaultMaxPatchFile, "largest file (bytes) the patch carries; bigger ones fail the patch (use export-tar)")
}

func exportFlags(fs *pflag.FlagSet, o *fsOpts) {
	diffFlags(fs, o)
	privilegeFlags(fs, o)
}

// privilegeFlags registers the opt-ins for privilege that promote and
// export-tar may carry to the host (docs/trust.md), named for what they
// allow.
func privilegeFlags(fs *pflag.FlagSet, o *fsOpts) {
	fs.BoolVar(&o.priv.SetID, "allow-setid", false, "keep setuid and setgid bits")
	fs.BoolVar(&o.priv.Devices, "allow-devices", false, "create (or include) character and block device nodes")
	fs.BoolVar(&o.priv.Owners, "keep-owners", false, "keep the snapshot's uid and gid (default: the running user's)")
}

// pathJSON is a path in --json output: the path as a JSON string and, when
// it is not valid UTF-8 (JSON strings turn such bytes into U+FFFD), its
// exact bytes in base64.
type pathJSON struct {
	Path    string `json:"path"`
	PathB64 string `json:"path_b64,omitempty"`
}

func jsonPath(p string) pathJSON {
	return pathJSON{Path: p, PathB64: pathjson.B64(p)}
}

// changeJSON is the --json form of one change.
type changeJSON struct {
	pathJSON
	Kind    string `json:"kind"`
	OldType string `json:"old_type,omitempty"`
	NewType string `json:"new_type,omitempty"`
	OldMode string `json:"old_mode,omitempty"`
	NewMode string `json:"new_mode,omitempty"`
	Size    int64  `json:"size,omitempty"`
}

// refusalJSON is the --json form of a change that was not carried.
type refusalJSON struct {
	pathJSON
	Reason string `json:"reason"`
}

func refusalsJSON(rs []cowfs.Refusal) []refusalJSON {
	out := make([]refusalJSON, 0, len(rs))
	for _, r := range rs {
		out = append(out, refusalJSON{jsonPath(r.Path), r.Reason})
	}
	return out
}

func fsDiff(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	a, b, err := resolvePair(ctx, f, pos)
	if err != nil {
		return err
	}
	changes, err := f.DiffWith(ctx, a, b, o.diff)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, changesJSON(changes))
	}
	return printChanges(w, changes)
}

// changesJSON turns changes into their --json form.
func changesJSON(changes []cowfs.Change) []changeJSON {
	out := make([]changeJSON, 0, len(changes))
	for _, c := range changes {
		j := changeJSON{pathJSON: jsonPath(c.Path), Kind: c.Kind.String()}
		if c.Old != nil {
			j.OldType, j.OldMode = c.Old.Type.String(), fmt.Sprintf("%04o", c.Old.Mode)
		}
		if c.New != nil {
			j.NewType, j.NewMode, j.Size = c.New.Type.String(), fmt.Sprintf("%04o", c.New.Mode), c.New.Size
		}
		out = append(out, j)
	}
	return out
}

// quoted is p as a Go string literal without the quotes: control bytes,
// invalid UTF-8 and backslashes escaped.
func quoted(p string) string {
	q := strconv.Quote(p)
	return q[1 : len(q)-1]
}

// printChanges lists changes one a line: a letter for the kind (Added,
// Deleted, Modified, Type changed, Permissions/metadata) and the path.
func printChanges(out io.Writer, changes []cowfs.Change) error {
	marks := map[cowfs.ChangeKind]string{cowfs.Added: "A", cowfs.Deleted: "D", cowfs.Modified: "M", cowfs.TypeChanged: "T", cowfs.ModeChanged: "P"}
	w := bufio.NewWriter(out)
	for _, c := range changes {
		p := c.Path
		if p == "" {
			p = "."
		}
		fmt.Fprintf(w, "%s %s\n", marks[c.Kind], quoted(p))
	}
	return w.Flush()
}

// printRefused writes what was left out, one a line.
func printRefused(w io.Writer, what string, rs []cowfs.Refusal) {
	for _, r := range rs {
		fmt.Fprintf(w, "%s %q: %s\n", what, r.Path, r.Reason)
	}
}

func fsPatch(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	a, b, err := resolvePair(ctx, f, pos)
	if err != nil {
		return err
	}
	left, err := f.WritePatch(ctx, w, a, b, cowfs.PatchOptions{DiffOptions: o.diff, MaxFile: o.maxFile})
	printRefused(o.errOut(), "not in patch:", left)
	return err
}

func fsExportTar(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	a, b, err := resolvePair(ctx, f, pos)
	if err != nil {
		return err
	}
	out, err := os.Create(pos[2])
	if err != nil {
		return fmt.Errorf("create %s: %w", pos[2], err)
	}
	res, err := f.WriteTar(ctx, out, a, b, cowfs.TarOptions{DiffOptions: o.diff, Privileges: o.priv})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(pos[2])
		return err
	}
	if o.json {
		deleted := make([]pathJSON, 0, len(res.Deleted))
		for _, d := range res.Deleted {
			deleted = append(deleted, jsonPath(d))
		}
		return writeJSON(w, map[string]any{"tar": pos[2], "deleted": deleted, "refused": refusalsJSON(res.Refused)})
	}
	for _, d := range res.Deleted {
		fmt.Fprintf(w, "deleted %q\n", d)
	}
	printRefused(w, "refused", res.Refused)
	return nil
}
