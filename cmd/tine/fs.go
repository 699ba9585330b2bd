package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

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
	flags   func(*flag.FlagSet, *fsOpts)
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
		flags: func(fs *flag.FlagSet, o *fsOpts) { fs.StringVar(&o.name, "name", "", "also name the snapshot") },
		do:    fsImport},
	{name: "mount", summary: "serve a branch at a directory until unmounted or signalled", args: []string{"BRANCH", "MOUNTPOINT"}, paths: []int{1},
		flags: func(fs *flag.FlagSet, o *fsOpts) {
			fs.BoolVar(&o.noPT, "no-passthrough", false, "serve every read through FUSE")
			fs.BoolVar(&o.others, "allow-other", false, "let users other than the mounting one enter the mount (off: only its owner can)")
			fs.BoolVar(&o.debug, "debug", false, "log FUSE requests")
			fs.DurationVar(&o.timeout, "timeout", 0, "kernel entry/attr cache time (default 1s, negative: none)")
		}},
	{name: "branch", summary: "fork a new branch from a snapshot (--quota BYTES)", args: []string{"SNAP", "NEWBRANCH"},
		flags: func(fs *flag.FlagSet, o *fsOpts) {
			fs.Int64Var(&o.quota, "quota", 0, "bytes the branch may write (0: no limit)")
		},
		do: fsBranch},
	{name: "snapshot", summary: "snapshot a branch's current state (--name N)", args: []string{"BRANCH"},
		flags: func(fs *flag.FlagSet, o *fsOpts) { fs.StringVar(&o.name, "name", "", "also name the snapshot") },
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

func init() {
	for _, c := range fsCmds {
		register(command{name: "fs " + c.name, summary: c.summary, run: func(ctx context.Context, args []string, w io.Writer) error {
			return runFS(ctx, c, args, w)
		}})
	}
}

// parseFS parses flags placed anywhere among the positional arguments.
func parseFS(c fsCmd, args []string) (*fsOpts, []string, error) {
	o, pos, _, err := parseFSFlags(c, args)
	return o, pos, err
}

// parseFSFlags is parseFS that also returns the flags that were set, as
// "-name=value" arguments.
func parseFSFlags(c fsCmd, args []string) (*fsOpts, []string, []string, error) {
	o := &fsOpts{}
	fs := newFlags("fs " + c.name)
	fs.StringVar(&o.root, "root", defaultRoot(), "state root (store, branches); default $TINE_ROOT or /var/lib/tine")
	fs.BoolVar(&o.json, "json", false, "print JSON")
	if c.flags != nil {
		c.flags(fs, o)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tine fs %s [flags] %s\n", c.name, strings.Join(c.args, " "))
		fs.PrintDefaults()
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, nil, err
			}
			return nil, nil, nil, usageErr("%v", err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != len(c.args) {
		return nil, nil, nil, usageErr("want %d arguments (%s), got %d", len(c.args), strings.Join(c.args, " "), len(pos))
	}
	var set []string
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name != "root" {
			set = append(set, "-"+fl.Name+"="+fl.Value.String())
		}
	})
	return o, pos, set, nil
}

func controlPath(root string) string { return filepath.Join(root, "control.sock") }

// runFS runs an fs command: through the control socket of a running
// "tine fs mount" when there is one (it owns the store then), else on the
// state root directly.
func runFS(ctx context.Context, c fsCmd, args []string, w io.Writer) error {
	o, pos, set, err := parseFSFlags(c, args)
	if err != nil {
		return err
	}
	if conn, err := net.Dial("unix", controlPath(o.root)); err == nil {
		defer conn.Close()
		fwd := append([]string{c.name}, set...)
		for i, p := range pos {
			for _, j := range c.paths {
				if i == j {
					if abs, err := filepath.Abs(p); err == nil {
						p = abs
					}
				}
			}
			fwd = append(fwd, p)
		}
		return forward(ctx, conn, fwd, w)
	}
	f, err := openRoot(o.root)
	if errors.Is(err, chunkstore.ErrLocked) {
		return fmt.Errorf("%w (a running tine process owns %s; its control socket %s does not answer)", err, o.root, controlPath(o.root))
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

// controlReq and controlResp are the newline-delimited JSON messages of
// the control socket.
type controlReq struct {
	Args []string `json:"args"` // fs subcommand and its arguments
}

type controlResp struct {
	Out   string `json:"out,omitempty"`
	Notes string `json:"notes,omitempty"` // for the client's stderr
	Err   string `json:"err,omitempty"`
	Usage bool   `json:"usage,omitempty"` // Err is a usage error
	Held  bool   `json:"held,omitempty"`  // a mount: it lasts as long as the connection
}

func forward(ctx context.Context, conn net.Conn, args []string, w io.Writer) error {
	if err := json.NewEncoder(conn).Encode(controlReq{Args: args}); err != nil {
		return fmt.Errorf("send to control socket: %w", err)
	}
	var resp controlResp
	dec := json.NewDecoder(bufio.NewReader(conn))
	if err := dec.Decode(&resp); err != nil {
		return fmt.Errorf("read from control socket: %w", err)
	}
	io.WriteString(w, resp.Out)
	io.WriteString(os.Stderr, resp.Notes)
	if resp.Err != "" {
		if resp.Usage {
			return usageErr("%s", resp.Err)
		}
		return errors.New(resp.Err)
	}
	if resp.Held {
		// The mount lives in the serving process until we hang up, or
		// until it is unmounted from outside and the server hangs up.
		gone := make(chan struct{})
		go func() {
			var b [1]byte
			conn.Read(b[:])
			close(gone)
		}()
		select {
		case <-ctx.Done():
		case <-gone:
		}
	}
	return nil
}

// server answers the control socket of a mounting process.
type server struct {
	f      *cowfs.FS
	ln     net.Listener
	path   string
	wg     sync.WaitGroup
	ctx    context.Context
	mounts sync.WaitGroup
}

func serveControl(ctx context.Context, f *cowfs.FS, root string) (*server, error) {
	p := controlPath(root)
	if conn, err := net.Dial("unix", p); err == nil {
		conn.Close()
		return nil, fmt.Errorf("control socket %s is already served", p)
	}
	ln, err := listenPrivate(p)
	if err != nil {
		return nil, err
	}
	s := &server{f: f, ln: ln, path: p, ctx: ctx}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				if err := checkPeer(conn); err != nil {
					json.NewEncoder(conn).Encode(controlResp{Err: err.Error()})
					conn.Close()
					return
				}
				s.handle(conn)
			}()
		}
	}()
	return s, nil
}

// listenPrivate listens on a Unix socket at p that only this user can
// connect to. The socket is bound under a temporary name, made 0600, and
// only then renamed to p, so it is never reachable with looser modes.
func listenPrivate(p string) (*net.UnixListener, error) {
	tmp := fmt.Sprintf("%s.%d.tmp", p, os.Getpid())
	os.Remove(tmp)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on control socket %s: %w", tmp, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("control socket %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("control socket %s: %w", p, err)
	}
	return ln, nil
}

// checkPeer admits a connection only from this process's user or root:
// the socket offers mounts, imports and promotions anywhere this user can
// write, so no one else may use it, whatever its file mode says.
func checkPeer(conn net.Conn) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return errors.New("control socket: not a Unix connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("control socket: peer credentials: %w", cerr)
	}
	if me := uint32(os.Geteuid()); cred.Uid != me && cred.Uid != 0 {
		return fmt.Errorf("control socket: uid %d may not use the control socket of uid %d", cred.Uid, me)
	}
	return nil
}

func (s *server) close() {
	s.ln.Close()
	os.Remove(s.path)
}

func (s *server) handle(conn net.Conn) {
	defer conn.Close()
	var req controlReq
	if err := json.NewDecoder(bufio.NewReader(io.LimitReader(conn, 1<<20))).Decode(&req); err != nil || len(req.Args) == 0 {
		json.NewEncoder(conn).Encode(controlResp{Err: "bad control request", Usage: true})
		return
	}
	var c *fsCmd
	for i := range fsCmds {
		if fsCmds[i].name == req.Args[0] {
			c = &fsCmds[i]
		}
	}
	if c == nil {
		json.NewEncoder(conn).Encode(controlResp{Err: fmt.Sprintf("unknown fs command %q", req.Args[0]), Usage: true})
		return
	}
	o, pos, err := parseFS(*c, req.Args[1:])
	var out strings.Builder
	var resp controlResp
	if err == nil && c.name == "mount" {
		m, merr := s.f.Mount(s.ctx, pos[0], pos[1], o.mountOptions())
		if merr != nil {
			json.NewEncoder(conn).Encode(controlResp{Err: merr.Error()})
			return
		}
		json.NewEncoder(conn).Encode(controlResp{Out: fmt.Sprintf("mounted %s at %s\n", pos[0], pos[1]), Held: true})
		// Unmount when the client hangs up or this process stops.
		done := make(chan struct{})
		go func() {
			var b [1]byte
			conn.Read(b[:])
			close(done)
		}()
		unmounted := make(chan struct{})
		go func() {
			m.Wait()
			close(unmounted)
		}()
		select {
		case <-done:
		case <-unmounted:
		case <-s.ctx.Done():
		}
		m.Unmount()
		return
	}
	var notes strings.Builder
	if err == nil {
		o.stderr = &notes
		err = c.do(s.ctx, s.f, o, pos, &out)
	}
	resp.Out, resp.Notes = out.String(), notes.String()
	if err != nil {
		resp.Err = err.Error()
		resp.Usage = errors.Is(err, errUsage)
	}
	json.NewEncoder(conn).Encode(resp)
}

func fsMount(ctx context.Context, f *cowfs.FS, o *fsOpts, pos []string, w io.Writer) (err error) {
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv, err := serveControl(sctx, f, o.root)
	if err != nil {
		// The mount still works; other commands cannot reach the store
		// while it runs.
		fmt.Fprintf(os.Stderr, "tine fs mount: no control socket: %v\n", err)
	} else {
		defer func() {
			srv.close()
			cancel()
			srv.wg.Wait()
		}()
	}
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
