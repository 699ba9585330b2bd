package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"tine/api"
	"tine/api/client"
	"tine/internal/atomicfile"
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
}

func (a *app) cpCommand() *cobra.Command {
	var mode string
	c := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "copy a file into or out of a sandbox (SB:PATH on one side; - is stdin or stdout)",
		Long: `Copy one file between the host and a sandbox. One side is SB:PATH, the
other a host path or - (standard input or output). A relative PATH is in the
sandbox's project directory; a PATH ending in / is a directory, and the file
keeps its name. The file arrives whole or not at all, on either side.

  tine cp notes.txt sb:/tmp/          into the sandbox, as /tmp/notes.txt
  tine cp sb:out/report.json .        out of it, into the current directory
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
				return usageErr("--mode is for a copy into a sandbox; out of one, the file gets the host's default mode")
			}
			return a.cpOut(c, src, dst.path)
		},
	}
	c.Flags().StringVar(&mode, "mode", "", "into a sandbox: the file's permission bits, such as 0755 (default: the host file's, or 0644 from stdin)")
	return c
}

// sandboxPath is p made absolute in sandbox sb (relative to its project
// directory), with base appended when p names a directory.
func sandboxPath(ctx context.Context, cl *client.Client, sb, p, base string) (string, error) {
	if p == "" {
		return "", usageErr("%s: no path after the colon; give SB:PATH", sb+":")
	}
	if strings.HasSuffix(p, "/") {
		if base == "" || base == "-" {
			return "", usageErr("%s:%s is a directory; name the file to write", sb, p)
		}
		p += base
	}
	if !path.IsAbs(p) {
		st, err := cl.Get(ctx, sb)
		if err != nil {
			return "", sbErr(sb, err)
		}
		p = path.Join(st.ProjectPath, p)
	}
	return path.Clean(p), nil
}

// cpIn copies host file local ("-": stdin) to dst in its sandbox.
func (a *app) cpIn(c *cobra.Command, local string, dst cpEnd, setMode bool, perm uint32) error {
	var r io.Reader = a.stdin
	if !setMode {
		perm = 0o644
	}
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return usageErr("%v", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return usageErr("%s is not a regular file; tine cp copies one file (a tree: tar -C %s -c . | tine exec -i %s -- tar -C DIR -x)", local, local, dst.sb)
		}
		if !setMode {
			perm = uint32(st.Mode().Perm())
		}
		r = f
	}
	cl, err := a.daemon(c.Context())
	if err != nil {
		return err
	}
	p, err := sandboxPath(c.Context(), cl, dst.sb, dst.path, filepath.Base(local))
	if err != nil {
		return err
	}
	cr := &countReader{r: r}
	if err := cl.PutFile(c.Context(), dst.sb, p, perm, cr); err != nil {
		return sbErr(dst.sb, err)
	}
	return a.cpDone(cpResult{Sandbox: dst.sb, Path: p, Local: local, Direction: "in", Bytes: cr.n})
}

// cpOut copies src from its sandbox to host path local ("-": stdout).
// A host file is written under a temporary name and renamed into place.
func (a *app) cpOut(c *cobra.Command, src cpEnd, local string) error {
	cl, err := a.daemon(c.Context())
	if err != nil {
		return err
	}
	p, err := sandboxPath(c.Context(), cl, src.sb, src.path, "")
	if err != nil {
		return err
	}
	if local == "-" {
		cw := &countWriter{w: a.stdout}
		if err := cl.GetFile(c.Context(), src.sb, p, cw); err != nil {
			return sbErr(src.sb, err)
		}
		return nil
	}
	if st, err := os.Stat(local); err == nil && st.IsDir() || strings.HasSuffix(local, "/") {
		local = filepath.Join(local, path.Base(p))
	}
	var n int64
	err = atomicfile.Write(local, 0o666&^umask(), func(w io.Writer) error {
		cw := &countWriter{w: w}
		err := cl.GetFile(c.Context(), src.sb, p, cw)
		n = cw.n
		return err
	})
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return usageErr("%v", err)
		}
		return sbErr(src.sb, err)
	}
	return a.cpDone(cpResult{Sandbox: src.sb, Path: p, Local: local, Direction: "out", Bytes: n})
}

// cpDone reports a copy: JSON on stdout, or a line on stderr (stdout may
// be the file).
func (a *app) cpDone(r cpResult) error {
	if a.json {
		return writeJSON(a.stdout, r)
	}
	if r.Direction == "in" {
		fmt.Fprintf(a.stderr, "copied %s (%s) to %s:%s\n", r.Local, humanBytes(r.Bytes), r.Sandbox, r.Path)
	} else if r.Local != "-" {
		fmt.Fprintf(a.stderr, "copied %s:%s (%s) to %s\n", r.Sandbox, r.Path, humanBytes(r.Bytes), r.Local)
	}
	return nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// umask is the process's file mode creation mask.
func umask() os.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return os.FileMode(m)
}
