package cowfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrConflict reports that a host directory no longer matches the snapshot
// a promotion starts from, so applying the changes would lose someone's
// work.
var ErrConflict = errors.New("host directory changed since the base snapshot")

// ErrCannotApply reports that the host directory cannot take the changes
// (a name too long, a directory the user may not write, too little free
// space), found before anything was written.
var ErrCannotApply = errors.New("host directory cannot take the changes")

// Conflict is one path whose state on the host is not what the base
// snapshot says, or that the host cannot take.
type Conflict struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// PromoteOptions says how Promote applies a snapshot's changes.
type PromoteOptions struct {
	// DryRun runs every check and writes nothing.
	DryRun bool
	// Privileges opts in to setuid and setgid bits, device nodes and the
	// snapshot's owners. The zero value carries none of them; each change
	// that would have needed one is listed in PromoteResult.Refused.
	Privileges HostPrivileges
	// Diff chooses which changes are promoted; by default nothing under a
	// .git directory is.
	Diff DiffOptions
	// Umask is cleared from every mode Promote sets, except for bits the
	// host entry already had. Nil means the process umask.
	Umask *uint32
}

// PromoteResult says what a promotion found and did.
type PromoteResult struct {
	Changes []Change // every change from base to snap that opts.Diff keeps
	// Modes[i] is the permission bits Changes[i] gets on the host (0
	// for a deletion).
	Modes     []uint32
	Conflicts []Conflict // paths where the host differs from base or cannot take the change
	// Refused lists each change not carried as the snapshot has it,
	// one entry per change: left out whole (device nodes, sockets) or
	// written without a privilege (setuid and setgid bits, owners); the
	// reason says which, and the option that allows it.
	Refused []Refusal
	Applied bool // the changes were written to the host directory
}

// promoteTestHook, when set, runs between the checks and the first write.
var promoteTestHook func()

// promoteStep is one change with what the checks found for it.
type promoteStep struct {
	Change
	mode    uint32 // permission bits on the host
	skip    bool   // refused whole: the host entry is left as it is
	chown   bool   // give the entry the snapshot's owner
	hostIno unix.Stat_t
	onHost  bool // the path existed on the host at the check
}

// Promote applies the changes from snapshot base to snapshot snap to the
// host directory dir, which is expected to still hold base.
//
// Before anything is written, every changed path is compared with base on
// the host (content, type, presence, mode) and every write the promotion
// will make is checked (name lengths, permission to write each directory,
// free space). A difference wraps ErrConflict, a write the host cannot
// take wraps ErrCannotApply; either way nothing is written and the result
// lists every path with its reason. With opts.DryRun the checks run and
// nothing is written.
//
// Nothing privileged reaches the host unless opts.Privileges allows it,
// and modes are cleared by the umask (see PromoteOptions). Paths are
// resolved beneath dir one name at a time without following any symlink;
// owners, modes and times are set through descriptors opened with
// O_NOFOLLOW. Every entry but a directory is written under a temporary
// name and renamed into place, so a hard link on the host is replaced,
// never written through; directories get their final mode after their
// contents, and every directory changed is fsync'd. The promotion as a
// whole is not atomic.
func (f *FS) Promote(ctx context.Context, base, snap SnapshotID, dir string, opts PromoteOptions) (*PromoteResult, error) {
	changes, err := f.DiffWith(ctx, base, snap, opts.Diff)
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("promote into %s: %w", dir, err)
	}
	defer unix.Close(root)
	h := &hostDir{fd: root, name: dir}
	umask := processUmask()
	if opts.Umask != nil {
		umask = *opts.Umask
	}
	res := &PromoteResult{Changes: changes, Modes: make([]uint32, len(changes))}
	steps := make([]promoteStep, len(changes))
	deleted := map[string]bool{}
	fresh := map[string]bool{} // directories the promotion creates
	for _, c := range changes {
		if c.Kind == Deleted {
			deleted[c.Path] = true
		}
		if c.New != nil && c.New.Type == TypeDir && (c.Old == nil || c.Old.Type != TypeDir) {
			fresh[c.Path] = true
		}
	}
	for i, c := range changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s := &steps[i]
		s.Change = c
		reason, err := f.checkHost(h, s, deleted, fresh)
		if err != nil {
			return nil, err
		}
		if reason != "" {
			res.Conflicts = append(res.Conflicts, Conflict{Path: c.Path, Reason: reason})
		}
		if r := s.plan(opts.Privileges, umask); r != "" {
			res.Refused = append(res.Refused, Refusal{Path: c.Path, Reason: r})
		}
		res.Modes[i] = s.mode
	}
	if len(res.Conflicts) > 0 {
		return res, fmt.Errorf("promote into %s: %d path(s) in conflict, first %q (%s): %w",
			dir, len(res.Conflicts), res.Conflicts[0].Path, res.Conflicts[0].Reason, ErrConflict)
	}
	if res.Conflicts = f.precheck(h, steps, fresh); len(res.Conflicts) > 0 {
		return res, fmt.Errorf("promote into %s: %d path(s) cannot be written, first %q (%s); nothing was written: %w",
			dir, len(res.Conflicts), res.Conflicts[0].Path, res.Conflicts[0].Reason, ErrCannotApply)
	}
	if opts.DryRun {
		return res, nil
	}
	if promoteTestHook != nil {
		promoteTestHook()
	}
	if err := f.apply(ctx, h, steps); err != nil {
		return res, err
	}
	res.Applied = true
	return res, nil
}

// plan decides the mode s gets on the host and whether it is refused,
// returning the reason when it is.
func (s *promoteStep) plan(p HostPrivileges, umask uint32) string {
	e := s.New
	if e == nil {
		return ""
	}
	// The umask never takes away a bit the host entry already had.
	s.mode = p.hostMode(e, umask)
	if s.onHost {
		s.mode |= e.Mode & s.hostIno.Mode & 0o1777
	}
	if r := p.refuse(e); r != "" {
		s.skip = true
		return r
	}
	var why []string
	if e.Type != TypeSymlink && e.Mode&0o6000 != 0 && !p.SetID {
		why = append(why, fmt.Sprintf("setuid/setgid bits not carried: mode %04o is written as %04o (allow with --allow-setid)", e.Mode&0o7777, s.mode))
	}
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	s.chown = p.Owners && (e.UID != uid || e.GID != gid)
	if !p.Owners && (e.UID != uid || e.GID != gid) {
		why = append(why, fmt.Sprintf("owner %d:%d not kept: written as %d:%d (allow with --keep-owners)", e.UID, e.GID, uid, gid))
	}
	return strings.Join(why, "; ")
}

// checkHost records the host's entry at s.Path and returns why it does not
// match the change's old side, or "" when it matches.
func (f *FS) checkHost(h *hostDir, s *promoteStep, deleted, fresh map[string]bool) (string, error) {
	c := s.Change
	var err error
	if c.Path == "" {
		err = unix.Fstat(h.fd, &s.hostIno)
	} else {
		err = h.lstat(c.Path, &s.hostIno)
	}
	s.onHost = err == nil
	if c.Old == nil {
		switch {
		case err == nil:
			return "exists on the host but not in the base snapshot", nil
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR) && fresh[path.Dir(c.Path)]:
			return "", nil // absent, or below what the promotion replaces
		case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
			return "a directory above it is a file or a symlink on the host", nil
		}
		return "", err
	}
	switch {
	case errors.Is(err, unix.ENOENT):
		return "missing on the host", nil
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		return "a directory above it is a file or a symlink on the host", nil
	case err != nil:
		return "", err
	}
	st := &s.hostIno
	if typ, _ := typeOfMode(st.Mode); typ != c.Old.Type {
		return fmt.Sprintf("is a %s on the host, a %s in the base snapshot", typ, c.Old.Type), nil
	}
	switch c.Old.Type {
	case TypeFile:
		if st.Size != c.Old.Size {
			return fmt.Sprintf("size %d on the host, %d in the base snapshot", st.Size, c.Old.Size), nil
		}
		same, err := f.sameAsHost(h, c.Path, c.Old)
		if err != nil {
			return "", err
		}
		if !same {
			return "content differs from the base snapshot", nil
		}
	case TypeSymlink:
		target, err := h.readlink(c.Path)
		if err != nil {
			return "", err
		}
		if target != c.Old.Target {
			return fmt.Sprintf("symlink to %q on the host, to %q in the base snapshot", target, c.Old.Target), nil
		}
	case TypeDir:
		if c.Kind == Deleted || c.Kind == TypeChanged {
			names, err := h.list(c.Path)
			if err != nil {
				return "", err
			}
			for _, n := range names {
				if !deleted[join(c.Path, n)] {
					return fmt.Sprintf("holds %q, which the base snapshot does not", n), nil
				}
			}
		}
	}
	if c.Kind == ModeChanged && st.Mode&0o7777 != c.Old.Mode&0o7777 {
		return fmt.Sprintf("mode %04o on the host, %04o in the base snapshot", st.Mode&0o7777, c.Old.Mode&0o7777), nil
	}
	return "", nil
}

// sameAsHost compares a host file with a file entry's content.
func (f *FS) sameAsHost(h *hostDir, p string, e *Entry) (bool, error) {
	fd, err := h.open(p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, err
	}
	hf := os.NewFile(uintptr(fd), path.Join(h.name, p))
	defer hf.Close()
	if fi, err := hf.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false, err // replaced since the lstat: not the base's file
	}
	want, err := f.contentReader(e)
	if err != nil {
		return false, err
	}
	a := make([]byte, 64<<10)
	b := make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(hf, a)
		nb, eb := io.ReadFull(want, b)
		if na != nb || !bytes.Equal(a[:na], b[:nb]) {
			return false, nil
		}
		if ea == io.EOF || ea == io.ErrUnexpectedEOF {
			return eb == io.EOF || eb == io.ErrUnexpectedEOF, nil
		}
		if ea != nil {
			return false, fmt.Errorf("read %s: %w", hf.Name(), ea)
		}
		if eb != nil {
			return false, fmt.Errorf("read snapshot file %s: %w", p, eb)
		}
	}
}

// writes reports whether applying s creates, replaces or removes a name
// in its parent directory.
func (s *promoteStep) writes() bool {
	if s.skip || s.Path == "" {
		return false
	}
	return s.Kind != ModeChanged || s.New.Type != TypeDir && !(s.New.Type == TypeFile && s.hostIno.Nlink == 1)
}

// precheck finds what would make the apply fail halfway: a name longer
// than the host filesystem takes, a directory the user may not write, an
// entry whose mode the user may not change, too little space or too few
// inodes. It returns one Conflict per problem.
func (f *FS) precheck(h *hostDir, steps []promoteStep, fresh map[string]bool) []Conflict {
	var out []Conflict
	bad := func(p, format string, a ...any) {
		out = append(out, Conflict{Path: p, Reason: fmt.Sprintf(format, a...)})
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(h.fd, &sfs); err != nil {
		bad("", "statfs: %v", err)
		return out
	}
	euid := uint32(os.Geteuid())
	parents := map[string]bool{}
	var need, inodes uint64
	bsize := uint64(sfs.Bsize)
	for i := range steps {
		s := &steps[i]
		if s.New != nil && !s.skip {
			for _, name := range strings.Split(s.Path, "/") {
				if s.Path != "" && int64(len(name)) > int64(sfs.Namelen) {
					bad(s.Path, "name %.40q... is %d bytes; the host filesystem takes at most %d", name, len(name), sfs.Namelen)
					break
				}
			}
			if s.Kind != ModeChanged {
				inodes++
				need += bsize
				if s.New.Type == TypeFile {
					n, err := f.dataBytes(s.New)
					if err != nil {
						bad(s.Path, "%v", err)
					}
					need += (n + bsize - 1) / bsize * bsize
				}
			}
		}
		if s.writes() || s.Kind == Deleted && s.Path != "" {
			parents[parentOf(s.Path)] = true
		}
		if s.Kind == ModeChanged && !s.writes() && !s.skip && euid != 0 && s.hostIno.Uid != euid {
			bad(s.Path, "owned by uid %d on the host: only its owner may change its mode", s.hostIno.Uid)
		}
	}
	for p := range parents {
		if fresh[p] {
			continue // created by the promotion, writable by its user
		}
		d, err := h.openDir(p)
		if err == nil {
			err = unix.Faccessat(d, ".", unix.W_OK|unix.X_OK, unix.AT_EACCESS)
			unix.Close(d)
		}
		if err != nil {
			bad(p, "directory cannot be written: %v", err)
		}
	}
	if avail := sfs.Bavail * bsize; need > avail {
		bad("", "the changes need about %d bytes; the host filesystem has %d free", need, avail)
	}
	if sfs.Files > 0 && inodes > sfs.Ffree {
		bad("", "the changes create %d entries; the host filesystem has %d free inodes", inodes, sfs.Ffree)
	}
	return out
}

// parentOf is the directory holding slash-separated path p ("" is the top).
func parentOf(p string) string {
	if d := path.Dir(p); d != "." {
		return d
	}
	return ""
}

// dataBytes is the bytes of e's content outside holes.
func (f *FS) dataBytes(e *Entry) (uint64, error) {
	runs, err := f.fileRuns(e)
	var n uint64
	for _, r := range runs {
		if !r.hole {
			n += uint64(r.n)
		}
	}
	return n, err
}

// apply writes the planned steps: removals deepest first, then creations
// and replacements in Diff's order, then the metadata of directories
// deepest first (so that a read-only directory is filled before it gets
// its mode, and its time is not disturbed by its contents), then an
// fsync of every directory changed.
func (f *FS) apply(ctx context.Context, h *hostDir, steps []promoteStep) error {
	touched := map[string]bool{}
	for i := len(steps) - 1; i >= 0; i-- {
		s := &steps[i]
		if s.skip || s.Path == "" || s.Old == nil {
			continue
		}
		if s.Kind == Deleted || s.Kind == TypeChanged && (s.Old.Type == TypeDir || s.New.Type == TypeDir) {
			if err := h.remove(s.Path, s.Old.Type == TypeDir); err != nil {
				return err
			}
			touched[parentOf(s.Path)] = true
		}
	}
	for i := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		s := &steps[i]
		if s.skip || s.New == nil || s.New.Type == TypeDir && s.Kind == ModeChanged {
			continue
		}
		if s.New.Type == TypeDir {
			if err := h.mkdir(s.Path); err != nil {
				return err
			}
		} else if err := f.place(h, s); err != nil {
			return err
		}
		touched[parentOf(s.Path)] = true
	}
	for i := len(steps) - 1; i >= 0; i-- {
		s := &steps[i]
		if s.skip || s.New == nil || s.New.Type != TypeDir {
			continue
		}
		d, err := h.openDir(s.Path)
		if err != nil {
			return err
		}
		err = s.setMeta(d, path.Join(h.name, s.Path))
		unix.Close(d)
		if err != nil {
			return err
		}
	}
	for p := range touched {
		d, err := h.openDir(p)
		if err == nil {
			err = unix.Fsync(d)
			unix.Close(d)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) { // ENOENT: removed by the promotion
			return fmt.Errorf("fsync %s: %w", path.Join(h.name, p), err)
		}
	}
	return nil
}

// place puts a non-directory entry at s.Path. A regular file whose only
// change is its mode, and which has no other name on the host, gets the
// new metadata in place; everything else is made under a temporary name
// and renamed over the old entry.
func (f *FS) place(h *hostDir, s *promoteStep) error {
	d, name, err := h.parent(s.Path)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	full := path.Join(h.name, s.Path)
	if s.Kind == ModeChanged && s.New.Type == TypeFile {
		fd, err := unix.Openat(d, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", full, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1 {
			err = s.setMeta(fd, full)
			unix.Close(fd)
			return err
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("stat %s: %w", full, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("promote %s: it stopped being a regular file on the host during the promotion; nothing more was written (check the directory, then promote again from its new state)", full)
		}
		// Other names share the inode: replace it instead.
	}
	tmp := tempName(name)
	fd, err := f.makeTemp(d, tmp, s.New)
	if err != nil {
		return fmt.Errorf("create %s beside %s: %w", tmp, full, err)
	}
	err = s.setMeta(fd, full)
	if err == nil && s.New.Type == TypeFile {
		err = unix.Fsync(fd)
	}
	unix.Close(fd)
	if err == nil {
		err = unix.Renameat(d, tmp, d, name)
	}
	if err != nil {
		unix.Unlinkat(d, tmp, 0)
		return fmt.Errorf("write %s: %w", full, err)
	}
	return nil
}

// tempName is the name a new entry has beside name until it is renamed
// over name. It names what it stands for, so that one left by a crash can
// be told apart, unless that would make it too long.
func tempName(name string) string {
	seq := tmpSeq.Add(1)
	if tmp := fmt.Sprintf(".%s.tine-promote-%d-%x", name, os.Getpid(), seq); len(tmp) <= 255 {
		return tmp
	}
	return fmt.Sprintf(".tine-promote-%d-%x", os.Getpid(), seq)
}

// makeTemp creates e under name tmp in directory d and returns a
// descriptor of it: a writable one for a file (its content written, holes
// left as holes), an O_PATH one for anything else.
func (f *FS) makeTemp(d int, tmp string, e *Entry) (int, error) {
	var err error
	switch e.Type {
	case TypeFile:
		// Written unnamed (O_TMPFILE) where the filesystem allows, and named
		// only once complete, so that a crash leaves no partly written file.
		fd, err := unix.Openat(d, ".", unix.O_WRONLY|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
		unnamed := err == nil
		if !unnamed {
			fd, err = unix.Openat(d, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		}
		if err != nil {
			return -1, err
		}
		err = f.writeContent(fd, e)
		if err == nil && unnamed {
			err = unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), d, tmp, unix.AT_SYMLINK_FOLLOW)
		}
		if err != nil {
			unix.Close(fd)
			if !unnamed {
				unix.Unlinkat(d, tmp, 0)
			}
			return -1, err
		}
		return fd, nil
	case TypeSymlink:
		err = unix.Symlinkat(e.Target, d, tmp)
	case TypeFifo:
		err = unix.Mknodat(d, tmp, unix.S_IFIFO|0o600, 0)
	case TypeChar:
		err = unix.Mknodat(d, tmp, unix.S_IFCHR|0o600, int(e.Rdev))
	case TypeBlock:
		err = unix.Mknodat(d, tmp, unix.S_IFBLK|0o600, int(e.Rdev))
	default:
		return -1, fmt.Errorf("cannot create a %s", e.Type)
	}
	if err != nil {
		return -1, err
	}
	fd, err := unix.Openat(d, tmp, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Unlinkat(d, tmp, 0)
	}
	return fd, err
}

// writeContent writes a file entry's content to fd: the file is sized
// first and only the data runs are written, so holes stay holes, and the
// content is streamed a buffer at a time.
func (f *FS) writeContent(fd int, e *Entry) error {
	runs, err := f.fileRuns(e)
	if err != nil {
		return err
	}
	if err := unix.Ftruncate(fd, e.Size); err != nil {
		return err
	}
	r, err := f.contentReader(e)
	if err != nil {
		return err
	}
	rs := r.(io.ReadSeeker)
	buf := make([]byte, 256<<10)
	for _, run := range runs {
		if run.hole {
			continue
		}
		if _, err := rs.Seek(run.off, io.SeekStart); err != nil {
			return err
		}
		for off, end := run.off, run.off+run.n; off < end; {
			n, err := io.ReadFull(rs, buf[:min(int64(len(buf)), end-off)])
			if err != nil {
				return err
			}
			for b := buf[:n]; len(b) > 0; {
				w, err := unix.Pwrite(fd, b, off)
				if err != nil {
					return err
				}
				b, off = b[w:], off+int64(w)
			}
		}
	}
	return nil
}

// setMeta gives the inode open at fd its owner, mode and times. fd was
// opened with O_NOFOLLOW (or made by the promotion), so no symlink on the
// host can redirect the change; nothing is done by path.
func (s *promoteStep) setMeta(fd int, name string) error {
	e := s.New
	if s.chown {
		if err := unix.Fchownat(fd, "", int(e.UID), int(e.GID), unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("chown %s: %w", name, err)
		}
	}
	if e.Type != TypeSymlink {
		err := unix.Fchmodat(fd, "", s.mode, unix.AT_EMPTY_PATH)
		if errors.Is(err, unix.EOPNOTSUPP) { // no fchmodat2 (Linux before 6.6)
			err = unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), s.mode)
		}
		if err != nil {
			return fmt.Errorf("chmod %s: %w", name, err)
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MtimeNs), unix.NsecToTimespec(e.MtimeNs)}
	if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("set time of %s: %w", name, err)
	}
	return nil
}

// processUmask reads the process umask without changing it (umask(2)
// would, for a moment, for every thread). Without /proc it assumes 022.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			var m uint32
			if _, err := fmt.Sscanf(l, "Umask:\t%o", &m); err == nil {
				return m & 0o777
			}
		}
	}
	return 0o022
}
