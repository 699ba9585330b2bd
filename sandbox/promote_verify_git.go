package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"tine/cowfs"
)

// commitSnapshot writes the tree of commit into a new directory under tmp
// (a clean checkout: tracked files only, no .git) and imports it into the
// store: what a verified promotion to git checks. Blobs are read with
// cat-file, so no filter or other configured program runs; every path is
// written beneath the directory through an os.Root.
func (m *Manager) commitSnapshot(ctx context.Context, g *gitRepo, commit, tmp string) (cowfs.SnapshotID, error) {
	var none cowfs.SnapshotID
	dir, err := os.MkdirTemp(tmp, "tree-")
	if err != nil {
		return none, err
	}
	defer os.RemoveAll(dir)
	if err := g.checkoutTree(ctx, commit, dir); err != nil {
		return none, fmt.Errorf("check out commit %s for the check: %w", commit, err)
	}
	return m.fs.Import(ctx, dir, "")
}

// checkoutTree writes the files of commit beneath dir.
func (g *gitRepo) checkoutTree(ctx context.Context, commit, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	ls, err := g.out(ctx, nil, "ls-tree", "-r", "-z", "--full-tree", commit)
	if err != nil {
		return err
	}
	type blob struct{ mode, oid, path string }
	var blobs []blob
	for _, rec := range bytes.Split(ls, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		meta, p, ok := strings.Cut(string(rec), "\t")
		f := strings.Fields(meta)
		if !ok || len(f) != 3 || !cleanTreePath(p) {
			return fmt.Errorf("unexpected ls-tree entry %q", rec)
		}
		if d := path.Dir(p); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		switch f[0] {
		case "160000": // a submodule: its directory, empty
			if err := root.Mkdir(p, 0o755); err != nil {
				return err
			}
		case "100644", "100755", "120000":
			blobs = append(blobs, blob{f[0], f[2], p})
		default:
			return fmt.Errorf("entry %q has mode %s", p, f[0])
		}
	}
	c := g.cmd(ctx, "cat-file", "--batch")
	in, err := c.StdinPipe()
	if err != nil {
		return err
	}
	outp, err := c.StdoutPipe()
	if err != nil {
		return err
	}
	if err := c.Start(); err != nil {
		return err
	}
	go func() {
		w := bufio.NewWriter(in)
		for _, b := range blobs {
			fmt.Fprintln(w, b.oid)
		}
		w.Flush()
		in.Close()
	}()
	r := bufio.NewReader(outp)
	err = func() error {
		for _, b := range blobs {
			hdr, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			var oid, typ string
			var size int64
			if _, err := fmt.Sscanf(hdr, "%s %s %d", &oid, &typ, &size); err != nil || typ != "blob" || oid != b.oid {
				return fmt.Errorf("cat-file answered %q for %s", strings.TrimSpace(hdr), b.oid)
			}
			data := io.LimitReader(r, size)
			if b.mode == "120000" {
				if size > 4096 {
					return fmt.Errorf("symlink %q: target of %d bytes", b.path, size)
				}
				t, err := io.ReadAll(data)
				if err != nil {
					return err
				}
				if err := root.Symlink(string(t), b.path); err != nil {
					return err
				}
			} else {
				perm := os.FileMode(0o644)
				if b.mode == "100755" {
					perm = 0o755
				}
				f, err := root.OpenFile(b.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
				if err != nil {
					return err
				}
				_, err = io.Copy(f, data)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return err
				}
			}
			if _, err := r.Discard(1); err != nil { // the newline after the object
				return err
			}
		}
		return nil
	}()
	if err != nil {
		c.Process.Kill()
	}
	return errors.Join(err, c.Wait())
}

// cleanTreePath reports whether p is a relative path of plain names.
func cleanTreePath(p string) bool {
	for _, n := range strings.Split(p, "/") {
		if n == "" || n == "." || n == ".." || strings.EqualFold(n, ".git") {
			return false
		}
	}
	return true
}
