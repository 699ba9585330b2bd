package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tine/api"
	"tine/api/client"
	"tine/guestagent/proto"
	"tine/internal/treecopy"
)

// cpEnd is one side of tine cp: a sandbox's path (sb set) or a local one
// ("-" is standard input or output).
type cpEnd struct {
	sb, path string
}

// parseCpEnd reads SB:PATH as a sandbox's path; anything else, including
// a path with a slash before its first colon, is local.
func parseCpEnd(s string) cpEnd {
	i := strings.IndexByte(s, ':')
	if i > 0 && !strings.Contains(s[:i], "/") {
		return cpEnd{sb: s[:i], path: s[i+1:]}
	}
	return cpEnd{path: s}
}

// cpResult is what tine cp --json prints.
type cpResult struct {
	Sandbox string `json:"sandbox"`
	// Path is the file's absolute path in the sandbox.
	Path string `json:"path"`
	// Local is the host's path, "-" for standard input or output.
	Local string `json:"local"`
	// Direction is "in" (host to sandbox) or "out".
	Direction string `json:"direction"`
	Bytes     int64  `json:"bytes"`
	// Tree says what a copy as a tree moved: every copy out to a host
	// path, and a directory copied in.
	Tree *treecopy.Stats `json:"tree,omitempty"`
}

func (a *app) cpCommand() *cobra.Command {
	var mode string
	c := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "copy a file or directory into or out of a sandbox (SB:PATH on one side; - is stdin or stdout)",
		Long: `Copy a file or a directory tree between the host and a sandbox. One side
is SB:PATH, the other a host path or - (standard input or output, one file's
bytes). A relative PATH is in the sandbox's project directory.

As with cp -r: a destination that is an existing directory receives the
copy under its source's name; any other destination names the copy itself,
and its parent must exist; one ending in / must be an existing directory.
A file arrives whole or not at all; so does a new directory tree, and into
an existing one each file is replaced whole. Modes and modification times
are kept; owners are not. Symlinks are copied as symlinks, never followed;
fifos, sockets and devices are left out. Out of a sandbox, setuid, setgid
and sticky bits are dropped and the host's umask applies, and an entry
that would land outside the destination or pass through a symlink stops
the copy, with nothing of a new tree left behind.

  tine cp notes.txt sb:/tmp/          into the sandbox, as /tmp/notes.txt
  tine cp ./src sb:/work/             the tree, as /work/src
  tine cp sb:out/report.json .        out of it, into the current directory
  tine cp sb:/work/dist ./dist        the sandbox's tree, as ./dist
  tar -c src | tine cp - sb:/tmp/src.tar`,
		Args: nArgs("SRC", "DST"),
		RunE: func(c *cobra.Command, args []string) error {
			src, dst := parseCpEnd(args[0]), parseCpEnd(args[1])
			switch {
			case src.sb != "" && dst.sb != "":
				return usageErr("both %q and %q name a sandbox; copy between sandboxes through the host", args[0], args[1])
			case src.sb == "" && dst.sb == "":
				return usageErr("neither %q nor %q names a sandbox; write one side as SB:PATH", args[0], args[1])
			}
			var perm uint32
			if mode != "" {
				var err error
				if perm, err = api.ParseMode(mode); err != nil {
					return usageErr("--mode %q: %v", mode, err)
				}
			}
			if dst.sb != "" {
				return a.cpIn(c, src.path, dst, mode != "", perm)
			}
			if mode != "" {
				return usageErr("--mode is for a copy into a sandbox; out of one, files keep their permission bits less the host's umask")
			}
			return a.cpOut(c, src, dst.path)
		},
	}
	c.Flags().StringVar(&mode, "mode", "", "into a sandbox, one file: its permission bits, such as 0755 (default: the host file's, or 0644 from stdin)")
	return c
}

// sandboxPath is p made absolute in sandbox sb (relative to its project
// directory) and cleaned; dir says whether p ended in a slash.
func sandboxPath(ctx context.Context, cl *client.Client, sb, p string) (abs string, dir bool, err error) {
	if p == "" {
		return "", false, usageErr("%s: no path after the colon; give SB:PATH", sb+":")
	}
	dir = strings.HasSuffix(p, "/")
	if !path.IsAbs(p) {
		st, err := cl.Get(ctx, sb)
		if err != nil {
			return "", false, sbErr(sb, err)
		}
		p = path.Join(st.ProjectPath, p)
	}
	return path.Clean(p), dir, nil
}

// cpIn copies host file or tree local ("-": a file from stdin) to dst in
// its sandbox.
func (a *app) cpIn(c *cobra.Command, local string, dst cpEnd, setMode bool, perm uint32) error {
	if local == "-" {
		if !setMode {
			perm = 0o644
		}
		return a.cpStdinIn(c, dst, perm)
	}
	f, err := os.Open(local)
	if err != nil {
		return usageErr("%v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var archive func(ctx context.Context, w io.Writer) (treecopy.Stats, error)
	switch {
	case st.IsDir():
		if setMode {
			return usageErr("--mode is for one file; the files of directory %s keep their modes", local)
		}
		// A symlink named on the command line is followed, as the
		// check above did.
		real, err := filepath.EvalSymlinks(local)
		if err == nil {
			real, err = filepath.Abs(real)
		}
		if err != nil {
			return usageErr("%v", err)
		}
		if real == "/" {
			return usageErr("%s is the host's root directory; copy a directory below it", local)
		}
		parent, err := os.Open(filepath.Dir(real))
		if err != nil {
			return usageErr("%v", err)
		}
		defer parent.Close()
		archive = func(ctx context.Context, w io.Writer) (treecopy.Stats, error) {
			return treecopy.Archive(ctx, w, int(parent.Fd()), filepath.Base(real))
		}
	case st.Mode().IsRegular():
		if !setMode {
			perm = proto.ModeBits(st.Mode())
		}
		archive = func(_ context.Context, w io.Writer) (treecopy.Stats, error) {
			return oneFile(w, f, st, perm)
		}
	default:
		return usageErr("%s is %s; tine cp copies regular files, directories and the symlinks in them", local, fileTypeName(st.Mode()))
	}
	return a.cpTreeIn(c, local, dst, archive)
}

// cpStdinIn writes standard input to the file dst names in its sandbox.
func (a *app) cpStdinIn(c *cobra.Command, dst cpEnd, perm uint32) error {
	cl, err := a.daemon(c.Context())
	if err != nil {
		return err
	}
	p, dir, err := sandboxPath(c.Context(), cl, dst.sb, dst.path)
	if err != nil {
		return err
	}
	if dir {
		return usageErr("%s:%s is a directory; name the file to write", dst.sb, dst.path)
	}
	cr := &countReader{r: a.stdin}
	if err := cl.PutFile(c.Context(), dst.sb, p, perm, cr); err != nil {
		return sbErr(dst.sb, err)
	}
	return a.cpDone(cpResult{Sandbox: dst.sb, Path: p, Local: "-", Direction: "in", Bytes: cr.n.Load()})
}

// oneFile writes a tar stream of open file f alone, named as its host
// name, with permission bits perm (07777).
func oneFile(w io.Writer, f *os.File, st os.FileInfo, perm uint32) (treecopy.Stats, error) {
	tw := tar.NewWriter(w)
	h := &tar.Header{Typeflag: tar.TypeReg, Name: st.Name(), Mode: int64(perm), Size: st.Size(), ModTime: st.ModTime(), Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return treecopy.Stats{}, err
	}
	if _, err := io.CopyN(tw, f, st.Size()); err != nil {
		return treecopy.Stats{}, fmt.Errorf("read %s: %w (did it shrink while it was copied?)", f.Name(), err)
	}
	return treecopy.Stats{Name: st.Name(), Files: 1, Bytes: st.Size()}, tw.Close()
}

// cpTreeIn copies what archive writes, a tar stream of host file or tree
// local made while it is sent, into dst's sandbox.
func (a *app) cpTreeIn(c *cobra.Command, local string, dst cpEnd, archive func(context.Context, io.Writer) (treecopy.Stats, error)) error {
	ctx := c.Context()
	cl, err := a.daemon(ctx)
	if err != nil {
		return err
	}
	p, into, err := sandboxPath(ctx, cl, dst.sb, dst.path)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	var st treecopy.Stats
	go func() {
		var err error
		st, err = archive(ctx, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	cr := &countReader{r: pr}
	stop := a.cpProgress(cr)
	p, err = cl.PutArchive(ctx, dst.sb, p, into, cr)
	stop()
	pr.CloseWithError(io.ErrClosedPipe) // the archive stops if the put did
	if aerr := <-done; aerr != nil && !errors.Is(aerr, io.ErrClosedPipe) {
		return fmt.Errorf("copy %s: %w", local, aerr)
	}
	if err != nil {
		return sbErr(dst.sb, err)
	}
	return a.cpDone(cpResult{Sandbox: dst.sb, Path: p, Local: local, Direction: "in", Bytes: st.Bytes, Tree: &st})
}

// cpOut copies the file or tree src from its sandbox to host path local
// ("-": one file's bytes on stdout).
func (a *app) cpOut(c *cobra.Command, src cpEnd, local string) error {
	ctx := c.Context()
	cl, err := a.daemon(ctx)
	if err != nil {
		return err
	}
	p, _, err := sandboxPath(ctx, cl, src.sb, src.path)
	if err != nil {
		return err
	}
	if local == "-" {
		if err := cl.GetFile(ctx, src.sb, p, a.stdout); err != nil {
			if strings.Contains(err.Error(), "is a directory") {
				return usageErr("%s:%s is a directory; copy it to a host directory (tine cp %s:%s DIR)", src.sb, p, src.sb, p)
			}
			return sbErr(src.sb, err)
		}
		return nil
	}
	if p == "/" {
		return usageErr("%s:/ is the sandbox's root directory; copy a directory below it", src.sb)
	}
	// The host, not the archive, names what is made.
	parentDir, name := filepath.Dir(local), filepath.Base(local)
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		parentDir, name = local, path.Base(p)
	} else if strings.HasSuffix(local, "/") {
		return usageErr("%s is not an existing directory", local)
	}
	parent, err := os.Open(parentDir)
	if err != nil {
		return usageErr("%v", err)
	}
	defer parent.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := cl.GetArchive(ctx, src.sb, p, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	cr := &countReader{r: pr}
	stop := a.cpProgress(cr)
	st, err := treecopy.Extract(ctx, cr, int(parent.Fd()), name, treecopy.Options{Umask: uint32(umask())})
	if err == nil {
		// The response ends after tar's end marker; reading it to its
		// end lets the download report how it ended.
		_, err = io.Copy(io.Discard, cr)
	}
	stop()
	pr.CloseWithError(io.ErrClosedPipe) // the download stops if the extraction did
	if gerr := <-done; gerr != nil && !errors.Is(gerr, io.ErrClosedPipe) {
		return sbErr(src.sb, gerr)
	}
	dest := filepath.Join(parentDir, name)
	if err != nil {
		return fmt.Errorf("copy %s:%s to %s: %w", src.sb, p, dest, err)
	}
	return a.cpDone(cpResult{Sandbox: src.sb, Path: p, Local: dest, Direction: "out", Bytes: st.Bytes, Tree: &st})
}

// cpDone reports a copy: JSON on stdout, or a line on stderr (stdout may
// be the file).
func (a *app) cpDone(r cpResult) error {
	if a.json {
		return writeJSON(a.stdout, r)
	}
	what := humanBytes(r.Bytes)
	if t := r.Tree; t != nil && t.Dirs > 0 {
		what = fmt.Sprintf("%s, %s, %s", plural(t.Files, "file"), plural(t.Dirs, "directory"), what)
		if t.Symlinks > 0 {
			what += ", " + plural(t.Symlinks, "symlink")
		}
	}
	if t := r.Tree; t != nil && t.Skipped > 0 {
		what += fmt.Sprintf("; %d fifos, sockets, devices or hard links left out", t.Skipped)
	}
	if r.Direction == "in" {
		fmt.Fprintf(a.stderr, "copied %s (%s) to %s:%s\n", r.Local, what, r.Sandbox, r.Path)
	} else if r.Local != "-" {
		fmt.Fprintf(a.stderr, "copied %s:%s (%s) to %s\n", r.Sandbox, r.Path, what, r.Local)
	}
	return nil
}

// countReader counts the bytes read through it; n may be read while
// another goroutine reads.
type countReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// cpProgress shows, on a terminal's stderr, how many bytes of a tree
// copy went through cr, twice a second until stop is called.
func (a *app) cpProgress(cr *countReader) (stop func()) {
	f, ok := a.stderr.(*os.File)
	if a.json || !ok || !term.IsTerminal(int(f.Fd())) {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				fmt.Fprint(f, "\r\033[K")
				return
			case <-t.C:
				fmt.Fprintf(f, "\r\033[Kcopying: %s", humanBytes(cr.n.Load()))
			}
		}
	}()
	return func() { close(done); <-exited }
}

// fileTypeName names the type of a file that tine cp does not copy.
func fileTypeName(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a fifo"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

// umask is the process's file mode creation mask.
func umask() os.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return os.FileMode(m)
}

// plural writes n with its noun: "1 file", "2 files", "3 directories".
func plural(n int, noun string) string {
	switch {
	case n == 1:
		return "1 " + noun
	case strings.HasSuffix(noun, "y"):
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(noun, "y"))
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
