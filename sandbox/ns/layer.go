package ns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"tine/internal/filecopy"
)

// copyLayer copies an upper layer directory to the new path to, keeping
// owners, modes, times, every extended attribute (overlayfs's own among
// them), whiteouts (0/0 character devices), other devices, fifos,
// symlinks and hard links, with reflinks where the file system has them.
// It copies in this process (a program start costs more than a small
// layer's copy); a layer it does not copy that way (deeper than
// maxLayerDepth, or a call that fails) is copied again by cp -a.
func copyLayer(ctx context.Context, from, to string) error {
	_, err := copyLayerIndexed(ctx, from, to)
	return err
}

// copyLayerIndexed is copyLayer that links, rather than copies, each
// file that one of refs (indexes of earlier copies of from's files, nil
// ones skipped) holds unchanged, and returns the index of this copy,
// rooted at to (nil where the copy fell back to cp -a).
func copyLayerIndexed(ctx context.Context, from, to string, refs ...*layerIndex) (*layerIndex, error) {
	c := layerCopy{ctx: ctx, links: map[[2]uint64]string{}, refs: refs, root: to, start: copyClock(),
		out: &layerIndex{root: to, files: map[fileID]indexed{}}}
	var st unix.Stat_t
	err := unix.Lstat(from, &st)
	if err == nil {
		c.out.src = fileID{st.Dev, st.Ino}
		err = c.copy(from, to, 0)
	}
	if err == nil {
		return c.out, nil
	}
	if ctx.Err() != nil {
		os.RemoveAll(to)
		return nil, fmt.Errorf("copy sandbox layer %s to %s: %w", from, to, ctx.Err())
	}
	if err := os.RemoveAll(to); err != nil {
		return nil, fmt.Errorf("copy sandbox layer %s to %s: clear a partial copy: %w", from, to, err)
	}
	cmd := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", from, to)
	if out, cerr := cmd.CombinedOutput(); cerr != nil {
		return nil, fmt.Errorf("copy sandbox layer %s to %s: %w: %s (first try: %v)", from, to, cerr, out, err)
	}
	return nil, nil
}

// copyClock gives a copy's start, against which it judges whether a file
// is settled (layerIndex); tests move it.
var copyClock = time.Now

// maxLayerDepth bounds the directory depth copyLayer walks itself.
const maxLayerDepth = 128

var errTooDeep = errors.New("layer deeper than the in-process copy goes")

type layerCopy struct {
	ctx   context.Context
	links map[[2]uint64]string // device and inode of a hard-linked file: its first copy
	refs  []*layerIndex        // earlier copies' files, linked where unchanged
	out   *layerIndex          // this copy's files
	root  string               // the copy's root, which out's paths are below
	start time.Time
}

// copy copies the entry from to the path to, which does not exist.
func (c *layerCopy) copy(from, to string, depth int) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(from, &st); err != nil {
		return err
	}
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := c.links[key]; ok && unix.Link(first, to) == nil {
			return nil
		}
		// The first name, or the first copy at the link count's bound
		// (an earlier copy that many snapshots and forks link): this
		// name is copied, and the next ones link to it.
		c.links[key] = to
	}
	switch typ {
	case unix.S_IFDIR:
		if depth >= maxLayerDepth {
			return errTooDeep
		}
		if err := unix.Mkdir(to, 0o700); err != nil {
			return err
		}
		err := eachName(from, func(n string) error {
			return c.copy(filepath.Join(from, n), filepath.Join(to, n), depth+1)
		})
		if err != nil {
			return err
		}
	case unix.S_IFREG:
		rel := strings.TrimPrefix(to, c.root+"/")
		for _, ref := range c.refs {
			if e, ok := ref.reuse(&st, to); ok {
				c.out.add(fileID{st.Dev, st.Ino}, e.stamp, rel)
				return nil // the linked copy has the attributes
			}
		}
		ok, err := copyFile(from, to, &st, c.start)
		if err != nil {
			return err
		}
		if ok {
			c.out.add(fileID{st.Dev, st.Ino}, stampOf(&st), rel)
		}
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlink(from, buf)
		if err != nil {
			return err
		}
		if err := unix.Symlink(string(buf[:n]), to); err != nil {
			return err
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknod(to, typ|0o600, int(st.Rdev)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%s: unknown file type %#o", from, typ)
	}
	return copyAttrs(from, to, &st)
}

// eachName calls fn with each name in directory dir, until fn returns
// an error, which it returns (or the directory's read error).
func eachName(dir string, fn func(name string) error) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return readNames(d, fn)
}

// dirBatch is how many names a directory walk reads at once: a sandbox
// can put millions of names (of up to 255 bytes) in one directory of its
// layer, which the daemon must never hold all at once.
const dirBatch = 512

// readNames calls fn with each name in the open directory d, read
// dirBatch at a time, until fn returns an error, which it returns (or
// the read's error).
func readNames(d *os.File, fn func(name string) error) error {
	for {
		names, err := d.Readdirnames(dirBatch)
		for _, n := range names {
			if err := fn(n); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// walkLayerAt calls fn for each entry below the directory dir, with its
// directory's descriptor, its name there and its stat (directories
// before what they hold), until fn returns an error, which it returns.
// Each directory is opened below its parent without following a link,
// so that a sandbox swapping a directory of its layer for a symlink
// (it runs meanwhile) never leads the walk out of the layer; an entry
// that changes under the walk is skipped. It goes maxLayerDepth levels
// down, no further.
func walkLayerAt(ctx context.Context, dir string, fn func(dfd int, name string, st *unix.Stat_t) error) error {
	return walkLayerDepth(ctx, dir, func(dfd int, name string, st *unix.Stat_t, _ int) error { return fn(dfd, name, st) })
}

// walkLayerDepth is walkLayerAt giving fn the depth of the entry's
// directory too (dir's entries are at 0): a directory found at
// maxLayerDepth or below is not walked.
func walkLayerDepth(ctx context.Context, dir string, fn func(dfd int, name string, st *unix.Stat_t, depth int) error) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	var walk func(fd, depth int) error
	walk = func(fd, depth int) error {
		d := os.NewFile(uintptr(fd), dir)
		defer d.Close()
		if err := ctx.Err(); err != nil {
			return err
		}
		var stop error // fn's error or the context's, which end the walk
		readNames(d, func(n string) error {
			var st unix.Stat_t
			if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				return nil
			}
			if stop = fn(fd, n, &st, depth); stop != nil {
				return stop
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR || depth >= maxLayerDepth {
				return nil
			}
			cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil
			}
			stop = walk(cfd, depth+1)
			return stop
		})
		return stop // a read that fails: the directory changed under the walk
	}
	return walk(fd, 0)
}

// copyFile copies a regular file's bytes, by reflink when the file
// system can, and reports whether the file was settled (see openSource)
// as the copy that began at start read it.
func copyFile(from, to string, st *unix.Stat_t, start time.Time) (bool, error) {
	src, ok, err := openSource(from, st, start)
	if err != nil {
		return false, err
	}
	defer src.Close()
	return ok, copyBytes(src, to)
}

// openSource opens the regular file from (stat st) to be copied and
// reports whether it is settled (see settledAs).
func openSource(from string, st *unix.Stat_t, start time.Time) (*os.File, bool, error) {
	src, err := os.OpenFile(from, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false, err
	}
	return src, settledAs(src, st, start), nil
}

// settledAs reports whether the open file src is still the file st
// describes, unchanged, and settled: sure to show a later change in its
// stamp (layerIndex) as a copy that began at start reads it.
func settledAs(src *os.File, st *unix.Stat_t, start time.Time) bool {
	var now unix.Stat_t
	return unix.Fstat(int(src.Fd()), &now) == nil && now.Dev == st.Dev && now.Ino == st.Ino &&
		stampOf(&now) == stampOf(st) && settled(int(src.Fd()), st, start)
}

// copyBytes copies src's bytes to the new file to, by reflink when the
// file system can, its holes left holes (filecopy).
func copyBytes(src *os.File, to string) error {
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if err := filecopy.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// copyAttrs gives to the owner, extended attributes, mode and times of
// from (st).
func copyAttrs(from, to string, st *unix.Stat_t) error {
	return setAttrs(to, st, func() error { return copyXattrs(from, to) })
}

// setAttrs gives to st's owner, then the extended attributes xattrs
// sets, then st's mode and times, in that order: a chown clears setuid
// bits, and writing attributes would change the times.
func setAttrs(to string, st *unix.Stat_t, xattrs func() error) error {
	if err := unix.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := xattrs(); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(to, st.Mode&07777); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, to, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// copyXattrs copies every extended attribute of from to to, neither
// followed if a symlink.
func copyXattrs(from, to string) error {
	names, err := listXattrs(from)
	if err != nil {
		return err
	}
	return setXattrs(to, names, func(n string, v []byte) (int, error) { return unix.Lgetxattr(from, n, v) })
}

// copyXattrsFd copies every extended attribute of the open file fd to
// to.
func copyXattrsFd(fd int, to string) error {
	names, err := xattrNames(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil {
		return err
	}
	return setXattrs(to, names, func(n string, v []byte) (int, error) { return unix.Fgetxattr(fd, n, v) })
}

// setXattrs sets on to (not followed) each attribute of names, as get
// reads it.
func setXattrs(to string, names []string, get func(name string, v []byte) (int, error)) error {
	for _, name := range names {
		vs, err := get(name, nil)
		if err != nil {
			return err
		}
		v := make([]byte, vs)
		if vs, err = get(name, v); err != nil {
			return err
		}
		if err := unix.Lsetxattr(to, name, v[:vs], 0); err != nil {
			return fmt.Errorf("%s: set %s: %w", to, name, err)
		}
	}
	return nil
}

// listXattrs returns the names of p's extended attributes, p not followed
// if a symlink; none where the file system has none.
func listXattrs(p string) ([]string, error) {
	return xattrNames(func(b []byte) (int, error) { return unix.Llistxattr(p, b) })
}

// xattrNames returns the attribute names list gives (a listxattr call).
func xattrNames(list func([]byte) (int, error)) ([]string, error) {
	sz, err := list(nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			err = nil
		}
		return nil, err
	}
	buf := make([]byte, sz)
	if sz, err = list(buf); err != nil {
		return nil, err
	}
	var names []string
	for _, n := range strings.Split(string(buf[:sz]), "\x00") {
		if n != "" {
			names = append(names, n)
		}
	}
	return names, nil
}
