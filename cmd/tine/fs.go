package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"tine/api"
	"tine/chunkstore"
	"tine/cowfs"
)

// fsCmd is one "tine fs" subcommand: its positional arguments and the
// function that carries it out on an open filesystem.
type fsCmd struct {
	name    string
	summary string
	args    []string // names of the positional arguments
	paths   []int    // positions that are host paths (made absolute when forwarded)
	flags   func(*pflag.FlagSet, *fsOpts)
	do      func(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error
}

// fsOpts holds the flags every fs command understands plus their own.
type fsOpts struct {
	root    string
	json    bool
	name    string
	quota   int64
	noPT    bool
	others  bool
	debug   bool
	timeout time.Duration
	dryRun  bool
	// diff, patch and export-tar
	diff    cowfs.DiffOptions
	maxFile int64
	priv    cowfs.HostPrivileges // what promote and export-tar may carry to the host
	stderr  io.Writer            // notes beside the output (nil: os.Stderr)
}

// errOut is where a command writes notes beside its output.
func (o *fsOpts) errOut() io.Writer {
	if o.stderr == nil {
		return os.Stderr
	}
	return o.stderr
}

var fsCmds = []fsCmd{
	{name: "import", summary: "store a host directory as a snapshot (--name N)", args: []string{"DIR"}, paths: []int{0},
		flags: func(fs *pflag.FlagSet, o *fsOpts) { fs.StringVar(&o.name, "name", "", "also name the snapshot") },
		do:    fsImport},
	{name: "mount", summary: "serve a branch at a directory until unmounted or signalled", args: []string{"BRANCH", "MOUNTPOINT"}, paths: []int{1},
		flags: func(fs *pflag.FlagSet, o *fsOpts) {
			fs.BoolVar(&o.noPT, "no-passthrough", false, "serve every read through FUSE")
			fs.BoolVar(&o.others, "allow-other", false, "let users other than the mounting one enter the mount (off: only its owner can)")
			fs.BoolVar(&o.debug, "debug", false, "log FUSE requests")
			fs.DurationVar(&o.timeout, "timeout", 0, "kernel entry/attr cache time (default 1s, negative: none)")
		}},
	{name: "branch", summary: "fork a new branch from a snapshot (--quota BYTES)", args: []string{"SNAP", "NEWBRANCH"},
		flags: func(fs *pflag.FlagSet, o *fsOpts) {
			fs.Int64Var(&o.quota, "quota", 0, "bytes the branch may write (0: no limit)")
		},
		do: fsBranch},
	{name: "snapshot", summary: "snapshot a branch's current state (--name N)", args: []string{"BRANCH"},
		flags: func(fs *pflag.FlagSet, o *fsOpts) { fs.StringVar(&o.name, "name", "", "also name the snapshot") },
		do:    fsSnapshot},
	{name: "rollback", summary: "return a branch to a snapshot", args: []string{"BRANCH", "SNAP"}, do: fsRollback},
	{name: "diff", summary: "list changes from A to B (snapshot id, snapshot name or branch)", args: []string{"A", "B"}, flags: diffFlags, do: fsDiff},
	{name: "patch", summary: "print changes from A to B as a unified patch", args: []string{"A", "B"}, flags: patchFlags, do: fsPatch},
	{name: "export-tar", summary: "write files changed from A to B as a tar; print deletions", args: []string{"A", "B", "FILE"}, paths: []int{2}, flags: exportFlags, do: fsExportTar},
	{name: "promote", summary: "apply changes from BASE to SNAP to a host directory after a conflict check (--dry-run)", args: []string{"BASE", "SNAP", "DIR"}, paths: []int{2},
		flags: promoteFlags, do: fsPromote},
	{name: "ls", summary: "list branches and snapshots", do: fsList},
	{name: "verify", summary: "check every object of the store and decode every snapshot and branch tree", do: fsVerify},
	{name: "quota", summary: "set the bytes a branch may write (0: no limit)", args: []string{"BRANCH", "BYTES"}, do: fsQuota},
	{name: "rm", summary: "delete an unmounted branch (its snapshots stay)", args: []string{"BRANCH"}, do: fsRemove},
}

// fsCommand is the "tine fs" family: the cowfs filesystem of the state
// root, one command per fsCmd.
func (a *app) fsCommand() *cobra.Command {
	g := group("fs", "the state root's filesystem: import, branch, mount, snapshot, diff, promote")
	for _, c := range fsCmds {
		o := &fsOpts{}
		use := strings.Join(append([]string{c.name}, c.args...), " ")
		cc := &cobra.Command{
			Use:   use,
			Short: c.summary,
			Args:  nArgs(c.args...),
			RunE: func(cmd *cobra.Command, pos []string) error {
				o.root, o.json = a.root, a.json
				return a.runFS(cmd.Context(), c, o, pos, flagsSet(cmd.Flags()))
			},
		}
		if c.flags != nil {
			c.flags(cc.Flags(), o)
		}
		g.AddCommand(cc)
	}
	return g
}

// lookupFS returns the fs command called name.
func lookupFS(name string) (fsCmd, bool) {
	for _, c := range fsCmds {
		if c.name == name {
			return c, true
		}
	}
	return fsCmd{}, false
}

// runFS runs an fs command: in the daemon when one answers (it owns the
// store then), else on the state root directly.
func (a *app) runFS(ctx context.Context, c fsCmd, o *fsOpts, pos []string, set map[string]string) error {
	w := a.stdout
	cl := a.client()
	if cl.Ping(ctx) == nil {
		abs := append([]string(nil), pos...)
		for _, j := range c.paths {
			if p, err := filepath.Abs(abs[j]); err == nil {
				abs[j] = p
			}
		}
		resp, err := cl.FS(ctx, c.name, api.FSRequest{Args: abs, Opts: set, JSON: o.json})
		if err != nil {
			return apiError(err)
		}
		io.WriteString(w, resp.Output)
		if c.name == "mount" {
			return holdMount(ctx, abs[1])
		}
		return nil
	}
	f, err := openRoot(o.root)
	if errors.Is(err, chunkstore.ErrLocked) {
		return fmt.Errorf("%w (a running tine process owns %s and its daemon socket %s does not answer; stop that process or wait for it)", err, o.root, a.socket())
	}
	if err != nil {
		return err
	}
	if c.name == "mount" {
		return fsMount(ctx, f, o, pos, w)
	}
	err = c.do(ctx, f, o, pos, w)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// holdMount waits while the daemon serves a mount at dir that "tine fs
// mount" asked for: until it is unmounted from outside, or, on a signal,
// unmounts it.
func holdMount(ctx context.Context, dir string) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			err := unix.Unmount(dir, 0)
			if err == unix.EBUSY {
				err = unix.Unmount(dir, unix.MNT_DETACH)
			}
			if err != nil && err != unix.EINVAL {
				return fmt.Errorf("unmount %s: %w", dir, err)
			}
			return nil
		case <-t.C:
			if !mounted(dir) {
				return nil
			}
		}
	}
}

// mounted reports whether dir is a mount point (of this mount namespace).
func mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMountPath(f[4]) == dir {
			return true
		}
	}
	return false
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func fsMount(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) (err error) {
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	m, err := f.Mount(ctx, pos[0], pos[1], o.mountOptions())
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "mounted %s at %s\n", pos[0], pos[1])
	if f, ok := w.(*os.File); ok {
		f.Sync()
	}
	done := make(chan struct{})
	go func() {
		m.Wait()
		close(done)
	}()
	select {
	case <-ctx.Done():
	case <-done:
	}
	return m.Unmount()
}

// mountOptions are the cowfs options the mount flags ask for.
func (o *fsOpts) mountOptions() *cowfs.MountOptions {
	return &cowfs.MountOptions{NoPassthrough: o.noPT, Debug: o.debug, Timeout: o.timeout, AllowOther: o.others}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func fsImport(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	id, err := f.Import(ctx, pos[0], o.name)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, map[string]string{"snapshot": id.String(), "name": o.name})
	}
	fmt.Fprintln(w, id)
	return nil
}

// resolve turns a command-line snapshot spec into an id; an unknown one
// is a usage error.
func resolve(ctx context.Context, f *cowfs.FS, spec string) (cowfs.SnapshotID, error) {
	id, err := f.Resolve(ctx, spec)
	if errors.Is(err, cowfs.ErrNoSnapshot) {
		return id, usageErr("%v", err)
	}
	return id, err
}

func fsBranch(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	snap, err := resolve(ctx, f, pos[0])
	if err != nil {
		return err
	}
	if err := f.Branch(ctx, snap, pos[1]); err != nil {
		if errors.Is(err, cowfs.ErrBadName) {
			return usageErr("%v", err)
		}
		return err
	}
	if o.quota > 0 {
		if err := f.SetQuota(ctx, pos[1], o.quota); err != nil {
			return err
		}
	}
	if o.json {
		return writeJSON(w, map[string]string{"branch": pos[1], "snapshot": snap.String()})
	}
	fmt.Fprintf(w, "branch %s from %s\n", pos[1], snap)
	return nil
}

func fsSnapshot(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	id, err := f.Snapshot(ctx, pos[0])
	if errors.Is(err, cowfs.ErrNoBranch) {
		return usageErr("%v", err)
	}
	if err != nil {
		return err
	}
	if o.name != "" {
		if err := f.NameSnapshot(ctx, id, o.name); err != nil {
			return err
		}
	}
	if o.json {
		return writeJSON(w, map[string]string{"snapshot": id.String(), "branch": pos[0], "name": o.name})
	}
	fmt.Fprintln(w, id)
	return nil
}

func fsRollback(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	snap, err := resolve(ctx, f, pos[1])
	if err != nil {
		return err
	}
	if err := f.Rollback(ctx, pos[0], snap); err != nil {
		if errors.Is(err, cowfs.ErrNoBranch) {
			return usageErr("%v", err)
		}
		return err
	}
	fmt.Fprintf(w, "branch %s is at %s\n", pos[0], snap)
	return nil
}

func fsList(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	bs, ss, err := f.List(ctx)
	if err != nil {
		return err
	}
	if o.json {
		if bs == nil {
			bs = []cowfs.BranchInfo{}
		}
		if ss == nil {
			ss = []cowfs.SnapshotInfo{}
		}
		return writeJSON(w, map[string]any{"branches": bs, "snapshots": ss})
	}
	fmt.Fprintln(w, "branches:")
	for _, b := range bs {
		state := ""
		if b.Mounted {
			state = " (mounted)"
		}
		quota := ""
		if b.QuotaBytes > 0 {
			quota = fmt.Sprintf(" quota %d/%d", b.UsedBytes, b.QuotaBytes)
		}
		fmt.Fprintf(w, "  %-20s head %s base %.12s%s%s\n", b.Name, b.HeadHex[:12], b.Base, quota, state)
	}
	fmt.Fprintln(w, "snapshots:")
	for _, s := range ss {
		fmt.Fprintf(w, "  %s %s\n", s.IDHex, strings.Join(s.Names, ","))
	}
	return nil
}

func fsQuota(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	n, err := strconv.ParseInt(pos[1], 10, 64)
	if err != nil || n < 0 {
		return usageErr("quota %q: want a byte count", pos[1])
	}
	if err := f.SetQuota(ctx, pos[0], n); err != nil {
		if errors.Is(err, cowfs.ErrNoBranch) {
			return usageErr("%v", err)
		}
		return err
	}
	return nil
}

func fsRemove(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	return f.DeleteBranch(ctx, pos[0])
}

// fsVerify checks the store (every object, ref and index) and then decodes
// every tree the filesystem keeps. Any problem makes it fail.
func fsVerify(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) error {
	rep, err := f.Store().Verify(ctx)
	if err != nil {
		return err
	}
	var problems []string
	for _, d := range rep.Damaged {
		problems = append(problems, "store: "+d.String())
	}
	st, err := f.Verify(ctx, func(p cowfs.Problem) { problems = append(problems, "tree: "+p.String()) })
	if err != nil {
		return err
	}
	if o.json {
		if problems == nil {
			problems = []string{}
		}
		if err := writeJSON(w, map[string]any{"objects": rep.Objects, "refs": rep.Refs, "trees": st.Trees,
			"dirs": st.Dirs, "files": st.Files, "problems": problems}); err != nil {
			return err
		}
	} else {
		for _, p := range problems {
			fmt.Fprintln(w, p)
		}
		fmt.Fprintf(w, "checked %d objects, %d refs, %d trees (%d directories, %d files): %d problems\n",
			rep.Objects, rep.Refs, st.Trees, st.Dirs, st.Files, len(problems))
	}
	if len(problems) > 0 {
		return fmt.Errorf("state root %s: %d problems found", o.root, len(problems))
	}
	return nil
}
