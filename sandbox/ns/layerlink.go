package ns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"tine/internal/nsinit"
)

// A sandbox made from a snapshot (a fork, or a create from one) does not
// copy the snapshot's OS layer: it stacks it, read-only, between its own
// empty layer and the host root (docs/adr/0206). The stacked layer,
// lowerDir in its state directory, is one directory tree whose files are
// hard links to the snapshot's: neither is ever written (overlayfs copies
// a file up into the sandbox's own layer before it changes it), so they
// can share inodes, and the sandbox keeps its layer when the snapshot is
// removed. A snapshot's state has two layers (its sandbox's own, copied,
// and the one that sandbox stacked, linked); linkLayers merges them into
// one, so that a chain of forks of forks stacks one layer, never more.
//
// overlayfs refuses a lower layer inside another one (the host root), so
// the stacked layer is seen through an overlay of its own (nsinit.StackedLower)
// and given to the root's overlay as that mount. That inner overlay would
// hide whiteouts and opaque marks from the outer one, so the stacked
// layer holds them escaped, as overlayfs's nesting expects: a whiteout is
// an empty file with the attribute trusted.overlay.overlay.whiteout, in a
// directory whose trusted.overlay.overlay.opaque is "x", and an opaque
// directory has it "y". The inner overlay shows them unescaped.

// The overlayfs attributes linkLayers reads and writes: an upper layer's
// (trusted.*: the daemon's overlays are mounted by the host's root;
// rootless mode copies its layers, see seedState) and their escaped forms.
const (
	ovlPrefix       = "trusted.overlay."
	ovlOpaque       = ovlPrefix + "opaque"
	ovlEscOpaque    = ovlPrefix + "overlay.opaque"
	ovlEscWhiteout  = ovlPrefix + "overlay.whiteout"
	opaqueAll       = "y" // the directory hides the layers below it
	opaqueWhiteouts = "x" // the directory holds escaped whiteouts
)

// linkLayers makes to, which does not exist, a stacked layer that shows
// what layers (upper first; each a directory, or missing; an upper layer
// or a stacked one) show stacked over the OS tree base: a directory is
// new, with the attributes of the upper-most one, and opaque where the
// stack hides what is below it; a whiteout is an escaped one, where base
// has something to hide ("" keeps every whiteout: overlayfs lists a
// whiteout in a directory that the OS does not have, which it then does
// not find); every other entry (files, symlinks, devices) is a hard link
// to the upper-most one, or a copy where it cannot be linked (the link
// count's bound, a file system that refuses).
func linkLayers(ctx context.Context, layers []string, base, to string) error {
	var dirs []string
	for _, l := range layers {
		if _, err := os.Lstat(l); err == nil {
			dirs = append(dirs, l)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stack layer %s: %w", l, err)
		}
	}
	if len(dirs) == 0 {
		return os.Mkdir(to, 0o755)
	}
	l := layerLink{ctx: ctx, base: base, root: to}
	if err := l.dir(dirs, to, false, 0); err != nil {
		return fmt.Errorf("stack layers %v in %s: %w", layers, to, err)
	}
	return nil
}

// stackSeed makes the layers of a sandbox starting from the state seed of
// a snapshot, over the OS tree base: lower, seed's layers stacked; upper,
// the sandbox's own, is left as it is (empty, or missing). Where seed's
// own layer is deeper (or its paths longer) than linkLayers goes, or the
// kernel cannot stack a layer (stackable), that layer is copied into upper
// instead (by cp -a past copyLayer's depth) and only the layer seed
// stacked, if any, is linked (an empty one otherwise).
func stackSeed(ctx context.Context, seed, base, lower, upper string) error {
	if stackable() {
		err := linkLayers(ctx, []string{filepath.Join(seed, upperDir), filepath.Join(seed, lowerDir)}, base, lower)
		if !errors.Is(err, errTooDeep) && !errors.Is(err, unix.ENAMETOOLONG) {
			return err
		}
		if err := os.RemoveAll(lower); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(upper); err != nil {
		return err
	}
	if err := copyLayer(ctx, filepath.Join(seed, upperDir), upper); err != nil {
		return err
	}
	return linkLayers(ctx, []string{filepath.Join(seed, lowerDir)}, base, lower)
}

// stackable reports whether this kernel's overlayfs shows a stacked layer
// as linkLayers makes it (escaped whiteouts and opaque marks, unescaped by
// an overlay of its own: Linux 6.7 and later). An older one would show a
// fork the whiteouts as empty files; it is tried once, on a tiny layer.
var stackable = sync.OnceValue(func() bool {
	err := probeStacking()
	if err != nil {
		fmt.Fprintf(os.Stderr, "tine: forks copy their snapshot's OS layer: this kernel cannot stack it (%v)\n", err)
	}
	return err == nil
})

// probeStacking stacks a layer that deletes a file of a small OS tree
// and checks that the file is gone from the overlay.
func probeStacking() error {
	dir, err := os.MkdirTemp("", "tine-stack-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	up, base, lower, empty := filepath.Join(dir, "up"), filepath.Join(dir, "os"), filepath.Join(dir, "lower"), filepath.Join(dir, "empty")
	for _, d := range []string{filepath.Join(up, "d"), filepath.Join(base, "d"), empty} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(base, "d", "w"), nil, 0o644); err != nil {
		return err
	}
	if err := unix.Mknod(filepath.Join(up, "d", "w"), unix.S_IFCHR, 0); err != nil {
		return err
	}
	if err := linkLayers(context.Background(), []string{up}, base, lower); err != nil {
		return err
	}
	lowers, sfd, err := nsinit.StackedLower(lower, empty, base, nil)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	fd, err := nsinit.NewMount("overlay", [][2]string{{"lowerdir", lowers}}, unix.MOUNT_ATTR_RDONLY, nil)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	d := fmt.Sprintf("/proc/self/fd/%d/d", fd)
	ents, err := os.ReadDir(d)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(d, "w")); err == nil || len(ents) != 0 {
		return errors.New("overlayfs shows an escaped whiteout as a file")
	}
	return nil
}

// osBase runs fn with the OS tree a sandbox's layers go over: image, or
// when it is "" the host's root mount alone (as the sandbox's overlay
// takes it: no mount below it), as a path.
func osBase(image string, fn func(base string) error) error {
	if image != "" {
		return fn(image)
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, "/", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("clone the host's root mount: %w", err)
	}
	defer unix.Close(fd)
	return fn(fmt.Sprintf("/proc/self/fd/%d", fd))
}

// maxNameSet is the most names of a directory's upper layers a merge
// keeps (about 1 MiB of names of 255 bytes).
const maxNameSet = 4096

// layerLink is one linkLayers walk.
type layerLink struct {
	ctx    context.Context
	base   string     // the OS tree below ("": none known)
	root   string     // the layer made
	copies *layerCopy // the files it could not link, copied
}

// dir makes the directory to, the merge of srcs (directories of the same
// path in the stacked layers, upper first, down to the first opaque one),
// opaque if hide.
func (l *layerLink) dir(srcs []string, to string, hide bool, depth int) error {
	if err := l.ctx.Err(); err != nil {
		return err
	}
	if depth >= maxLayerDepth {
		return errTooDeep
	}
	var st unix.Stat_t
	if err := unix.Lstat(srcs[0], &st); err != nil {
		return err
	}
	if err := unix.Mkdir(to, 0o700); err != nil {
		return err
	}
	hide = hide || isOpaque(srcs[0])
	// Each name once: a lower layer's name that an upper one has was
	// made from that one. The upper layers' names are kept while they
	// are few (the fork's hot path); past maxNameSet, a lower name is
	// looked up in them instead (the layers are never written), so the
	// merge's memory is bounded whatever a directory's size.
	seen := map[string]bool{}
	many := false
	above := func(upper []string, n string) bool {
		if !many {
			return seen[n]
		}
		for _, up := range upper {
			var ust unix.Stat_t
			if unix.Lstat(filepath.Join(up, n), &ust) == nil {
				return true
			}
		}
		return false
	}
	whiteouts := false
	for i, s := range srcs {
		err := eachName(s, func(n string) error {
			if i > 0 && above(srcs[:i], n) {
				return nil
			}
			if i < len(srcs)-1 && !many {
				seen[n] = true
				if many = len(seen) > maxNameSet; many {
					clear(seen)
				}
			}
			wo, err := l.entry(srcs, n, filepath.Join(to, n), hide, depth)
			whiteouts = whiteouts || wo
			return err
		})
		if err != nil {
			return err
		}
	}
	if err := copyAttrs(srcs[0], to, &st); err != nil {
		return err
	}
	if err := dropOverlayXattrs(to); err != nil {
		return err
	}
	switch {
	case hide:
		return unix.Lsetxattr(to, ovlEscOpaque, []byte(opaqueAll), 0)
	case whiteouts:
		return unix.Lsetxattr(to, ovlEscOpaque, []byte(opaqueWhiteouts), 0)
	}
	return nil
}

// entry makes to, the entry name of the merged directories srcs (opaque
// if hide: whiteouts in it are left out), and reports whether it is a
// whiteout.
func (l *layerLink) entry(srcs []string, name, to string, hide bool, depth int) (bool, error) {
	var dirs []string
	below := false // a layer's file or whiteout below a directory ends the merge
	for _, s := range srcs {
		p := filepath.Join(s, name)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); errors.Is(err, unix.ENOENT) {
			continue
		} else if err != nil {
			return false, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if len(dirs) > 0 {
				below = true
				break
			}
			if !isWhiteout(p, &st) {
				return false, l.link(p, to, depth)
			}
			if hide || !l.inBase(to) {
				return false, nil // nothing below to hide
			}
			fd, err := unix.Open(to, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return false, err
			}
			unix.Close(fd)
			return true, unix.Lsetxattr(to, ovlEscWhiteout, nil, 0)
		}
		dirs = append(dirs, p)
		if isOpaque(p) {
			// Below the upper-most directory, an opaque one makes the
			// merge opaque too: it hid the host's.
			below = below || len(dirs) > 1
			break
		}
	}
	if len(dirs) == 0 {
		return false, nil // listed, then gone from every layer
	}
	return false, l.dir(dirs, to, below, depth+1)
}

// inBase reports whether the OS tree has an entry where to is in the
// layer made (yes when it is not known).
func (l *layerLink) inBase(to string) bool {
	if l.base == "" {
		return true
	}
	var st unix.Stat_t
	err := unix.Lstat(l.base+strings.TrimPrefix(to, l.root), &st)
	return !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR)
}

// link makes to a hard link to the non-directory from, or a copy of it
// (one copy for the names of one file: a file at the link count's bound
// with thousands of names is copied once, not once a name).
func (l *layerLink) link(from, to string, depth int) error {
	if err := unix.Link(from, to); err == nil {
		return nil
	}
	if l.copies == nil {
		l.copies = &layerCopy{ctx: l.ctx, links: map[[2]uint64]string{}}
	}
	return l.copies.copy(from, to, depth)
}

// isWhiteout reports whether the layer entry p (st) is a whiteout: an
// upper layer's (a 0/0 character device) or a stacked layer's (escaped).
func isWhiteout(p string, st *unix.Stat_t) bool {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return st.Rdev == 0
	case unix.S_IFREG:
		if st.Size != 0 {
			return false
		}
		_, err := unix.Lgetxattr(p, ovlEscWhiteout, nil)
		return err == nil
	}
	return false
}

// isOpaque reports whether the layer directory p hides the layers below
// it, in an upper layer or a stacked one.
func isOpaque(p string) bool {
	for _, n := range []string{ovlOpaque, ovlEscOpaque} {
		var v [2]byte
		if k, err := unix.Lgetxattr(p, n, v[:]); err == nil && k == 1 && v[0] == opaqueAll[0] {
			return true
		}
	}
	return false
}

// dropOverlayXattrs removes overlayfs's attributes, escaped or not, from
// the new directory p: a stacked layer's are set by linkLayers alone.
func dropOverlayXattrs(p string) error {
	names, err := listXattrs(p)
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, ovlPrefix) {
			if err := unix.Lremovexattr(p, n); err != nil {
				return err
			}
		}
	}
	return nil
}
