package cowfs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

// The fsync log (ADR 0196). An fsync commits the branch (ADR 0011), but a
// file with many bytes written since the last commit is not cut into
// chunks on the way: its overlay file is made durable where it lies, the
// commit's tree keeps the file's committed part (its chunk list as it is
// now, without the written bytes), and a small log object says which
// overlay ranges complete it. The log's ref moves in the same ref log
// record as the head, so after a crash either both are kept or neither.
// The written bytes go into the store later, by a commit that runs a
// moment after the fsync (commitBehind) or by any commit before that;
// that commit deletes the log's ref with the same record that moves the
// head. Opening a branch with a log (FS.Open does so for every branch)
// folds the log in first.

const (
	refPending = "cowfs/pending/" // + branch: the branch's fsync log

	logMinBytes   = 1 << 20          // written bytes that make a file worth logging rather than storing
	logMaxExtents = 256              // written ranges of one logged file
	logMaxFiles   = 64               // files of one log
	logMaxDepth   = 4096             // names in a logged file's path
	maxLogObject  = 1 << 20          // bytes of an encoded log decodeLog accepts
	logBudget     = maxLogObject / 2 // bytes of paths and ranges one log takes, at most (estimated high)
	commitBehind  = time.Second
)

// fsyncLog is the stored form of a branch's fsync log.
type fsyncLog struct {
	Root  string       `json:"root"` // the head it completes (hex id)
	Files []loggedFile `json:"files"`
}

// loggedFile is one file of an fsync log: in the log's head it holds its
// committed part; the written ranges of its overlay file complete it.
type loggedFile struct {
	Path    [][]byte   `json:"path"`    // names from the root (a hard-linked file: one of them)
	Size    int64      `json:"size"`    // the file's size
	Extents [][2]int64 `json:"extents"` // written ranges [off, end): sorted, apart, within size
	Overlay string     `json:"overlay"` // the overlay file's name in the branch's overlay directory
}

var overlayNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`) })

// decodeLog parses and checks a stored fsync log.
func decodeLog(b []byte) (*fsyncLog, error) {
	if len(b) > maxLogObject {
		return nil, fmt.Errorf("%w: fsync log of %d bytes, want at most %d", errCorrupt, len(b), maxLogObject)
	}
	var l fsyncLog
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&l); err != nil {
		return nil, fmt.Errorf("%w: fsync log: %v", errCorrupt, err)
	}
	if _, err := chunkstore.ParseID(l.Root); err != nil {
		return nil, fmt.Errorf("%w: fsync log root %q: %v", errCorrupt, l.Root, err)
	}
	if len(l.Files) == 0 || len(l.Files) > logMaxFiles {
		return nil, fmt.Errorf("%w: fsync log of %d files, want 1 to %d", errCorrupt, len(l.Files), logMaxFiles)
	}
	seen := map[string]bool{}
	for i, f := range l.Files {
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%w: fsync log file %d: %s", errCorrupt, i, fmt.Sprintf(format, a...))
		}
		if len(f.Path) == 0 || len(f.Path) > logMaxDepth {
			return nil, bad("path of %d names", len(f.Path))
		}
		for _, n := range f.Path {
			if err := checkEntryName(string(n)); err != nil {
				return nil, bad("%v", err)
			}
		}
		if !overlayNameRE().MatchString(f.Overlay) || seen[f.Overlay] {
			return nil, bad("overlay name %q", f.Overlay)
		}
		seen[f.Overlay] = true
		if f.Size < 0 || len(f.Extents) == 0 || len(f.Extents) > logMaxExtents {
			return nil, bad("size %d with %d ranges", f.Size, len(f.Extents))
		}
		var last int64
		for _, x := range f.Extents {
			if x[0] < last || x[1] <= x[0] || x[1] > f.Size || (last > 0 && x[0] == last) {
				return nil, bad("range [%d, %d) after %d in a file of %d bytes", x[0], x[1], last, f.Size)
			}
			last = x[1]
		}
	}
	return &l, nil
}

// checkEntryName refuses a name no directory entry can have.
func checkEntryName(n string) error {
	if n == "" || n == "." || n == ".." || len(n) > 255 || bytes.ContainsAny([]byte(n), "/\x00") {
		return fmt.Errorf("bad name %q", n)
	}
	return nil
}

// liveLog is the state of a branch's fsync log while the branch is open.
type liveLog struct {
	id       chunkstore.ID   // the stored log its ref names
	overlays map[string]bool // overlay paths the log needs
	held     []string        // of those, overlay paths no file uses any more
	ins      []*inode        // the logged files (none after a fold)
}

// logging collects the files an fsync's commit leaves to the log.
type logging struct {
	log   fsyncLog
	files map[*fileData]loggedEntry
	ins   []*inode
	bytes int // the encoded log's size, at most: kept under logBudget
}

// loggedEntry is what the commit's tree holds for a logged file: its
// committed part.
type loggedEntry struct {
	id   chunkstore.ID
	size int64
}

// loggable reports whether an fsync may leave a file's written bytes in
// its overlay file.
func (lg *logging) loggable(fd *fileData) bool {
	if !fd.changed || fd.ovPath == "" || fd.mem != nil || len(fd.dirty) == 0 || len(fd.dirty) > logMaxExtents || len(lg.log.Files) >= logMaxFiles {
		return false
	}
	var n int64
	for _, x := range fd.dirty {
		n += x.end - x.off
	}
	return n >= logMinBytes
}

// logFile records a file in the fsync's log instead of storing its written
// bytes, and returns the entry the tree gets for it (its committed part);
// ok is false when the log has no room for its path (the commit stores
// the file). Caller holds b.mu.
func (b *branch) logFile(in *inode, path []string) (e loggedEntry, ok bool, err error) {
	lg := b.logging
	fd := in.f
	if e, ok := lg.files[fd]; ok {
		return e, true, nil // another name of a hard-linked file
	}
	size := 100 + 44*len(fd.dirty) // an upper bound of the file's JSON
	for _, n := range path {
		if checkEntryName(n) != nil {
			return e, false, nil // a name decodeLog would refuse
		}
		size += 8 + 4*(len(n)+2)/3
	}
	if len(path) > logMaxDepth || lg.bytes+size > logBudget {
		return e, false, nil
	}
	lg.bytes += size
	id, err := putFile(b.fs.store, fd.refs)
	if err != nil {
		return e, false, fmt.Errorf("branch %q: write file object: %w", b.name, err)
	}
	lf := loggedFile{Size: in.size, Overlay: filepath.Base(fd.ovPath)}
	for _, n := range path {
		lf.Path = append(lf.Path, []byte(n))
	}
	for _, x := range fd.dirty {
		lf.Extents = append(lf.Extents, [2]int64{x.off, x.end})
	}
	lg.log.Files = append(lg.log.Files, lf)
	e = loggedEntry{id: id, size: fd.baseLen()}
	lg.files[fd] = e
	lg.ins = append(lg.ins, in)
	return e, true, nil
}

// sync is an fsync of the branch: a commit that logs the files with many
// written bytes instead of storing them (see the top of this file).
func (b *branch) sync(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.bound() {
		return nil // a placeholder holds nothing to commit
	}
	_, err := b.commitWith(ctx, false, true)
	return err
}

// makeLogDurable makes the logged files' overlay files durable, with the
// directory entries that name them. Caller holds b.mu.
func (b *branch) makeLogDurable() error {
	for _, in := range b.logging.ins {
		ov, err := b.overlay(in)
		if err == nil {
			err = unix.Fdatasync(int(ov.Fd()))
		}
		if err != nil {
			return fmt.Errorf("branch %q: sync overlay %s: %w", b.name, in.f.ovPath, err)
		}
	}
	for _, d := range []string{filepath.Join(b.dir, "overlay"), b.dir} {
		if err := syncDir(d); err != nil {
			return fmt.Errorf("branch %q: %w", b.name, err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// logUpdate stores the fsync's log (if any file was logged) and returns
// the ref update that makes it the branch's log, or that drops the log it
// replaces; ok is false when the ref stays as it is. Caller holds b.mu.
func (b *branch) logUpdate(root chunkstore.ID) (up chunkstore.RefUpdate, newLog *liveLog, ok bool, err error) {
	var cur chunkstore.ID
	if b.pend != nil {
		cur = b.pend.id
	}
	up = chunkstore.RefUpdate{Name: refPending + b.name, Old: cur}
	if b.logging == nil || len(b.logging.log.Files) == 0 {
		return up, nil, !cur.IsZero(), nil
	}
	b.logging.log.Root = root.String()
	data, err := json.Marshal(&b.logging.log)
	if err == nil {
		up.New, err = b.fs.store.Put(data)
	}
	if err != nil {
		return up, nil, false, fmt.Errorf("branch %q: store fsync log: %w", b.name, err)
	}
	newLog = &liveLog{id: up.New, overlays: map[string]bool{}, ins: b.logging.ins}
	for _, in := range b.logging.ins {
		newLog.overlays[in.f.ovPath] = true
	}
	return up, newLog, up.New != cur, nil
}

// setLog makes l the branch's live log once its ref is durable: overlay
// files that only the old log needed are removed, and a commit of the
// logged bytes is scheduled. Caller holds b.mu.
func (b *branch) setLog(l *liveLog) {
	if old := b.pend; old != nil {
		for _, p := range old.held {
			if l != nil && l.overlays[p] {
				l.held = append(l.held, p)
			} else {
				b.removals.remove(p)
			}
		}
	}
	b.pend = l
	if l == nil {
		if b.behind != nil {
			b.behind.Stop()
			b.behind = nil
		}
		return
	}
	if b.behind == nil {
		b.behind = time.AfterFunc(commitBehind, b.commitLogged)
	} else {
		b.behind.Reset(commitBehind)
	}
}

// commitLogged stores the bytes the live log holds (the commit after an
// fsync). The logged files are cut into chunks without the branch's lock,
// from a copy of their state and their overlay files, so that the mount
// keeps serving meanwhile; a file changed in between is left to the
// commit that follows, which runs under the lock. A failure leaves the
// log in place for the next commit.
func (b *branch) commitLogged() {
	ctx := context.Background()
	b.mu.Lock()
	b.behind = nil
	l := b.pend
	if l == nil || !b.bound() {
		b.mu.Unlock()
		return
	}
	name := b.name
	var fs []*frozenFile
	for _, in := range l.ins {
		if fd := in.f; fd != nil && fd.changed && fd.ovPath != "" && fd.mem == nil {
			fs = append(fs, freeze(in))
		}
	}
	b.mu.Unlock()

	for _, f := range fs {
		f.cut(ctx, b.fs.store, name)
	}
	if hook := commitLoggedTestHook.Swap(nil); hook != nil {
		(*hook)()
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pend != l || !b.bound() || b.name != name {
		return // another commit, a rollback or an unmount came first
	}
	for _, f := range fs {
		fd := f.in.f
		if f.err == nil && fd == f.fd && fd.gen == f.gen && fd.ovPath == f.ovPath && fd.changed {
			if err := b.installFile(f.in, f.out); err != nil {
				return
			}
		}
	}
	b.commitRefs(ctx, false)
}

// commitLoggedTestHook, when set (by tests), runs once after commitLogged
// cut the files and before it takes the lock again.
var commitLoggedTestHook atomic.Pointer[func()]

// holdOverlay keeps an overlay file that the live log needs (its file's
// bytes were stored or dropped since the log was made) until the log is
// replaced. Caller holds b.mu.
func (b *branch) holdOverlay(path string) bool {
	if b.pend == nil || !b.pend.overlays[path] {
		return false
	}
	b.pend.held = append(b.pend.held, path)
	return true
}

// needsLog reports whether a file's overlay file is one the live log
// needs as it is: a change that would cut or punch it must first store
// the log's bytes (commitRefs). Caller holds b.mu.
func (b *branch) needsLog(fd *fileData) bool {
	return b.pend != nil && fd.ovPath != "" && b.pend.overlays[fd.ovPath]
}

// readLog returns the branch's stored fsync log, if it has one.
func (f *FS) readLog(name string) (chunkstore.ID, *fsyncLog, error) {
	id, ok, err := f.getRef(refPending + name)
	if err != nil || !ok {
		return id, nil, err
	}
	data, err := f.store.Get(id)
	var l *fsyncLog
	if err == nil {
		l, err = decodeLog(data)
	}
	if err != nil {
		return id, nil, fmt.Errorf("branch %q: read fsync log %s: %w", name, id, err)
	}
	return id, l, nil
}

// foldLog puts the bytes of the branch's fsync log, if it has one, into
// the store and drops the log. b is just opened; caller owns it alone.
func (b *branch) foldLog() error {
	id, l, err := b.fs.readLog(b.name)
	if err != nil || l == nil {
		return b.logErr(err)
	}
	if l.Root != b.head.String() {
		// Every head move drops the log; a log of another head is left
		// over from a failed update and completes nothing.
		if err := b.fs.store.DeleteRef(refPending+b.name, id); err != nil {
			return fmt.Errorf("branch %q: drop stale fsync log: %w", b.name, err)
		}
		return nil
	}
	b.pend = &liveLog{id: id, overlays: map[string]bool{}}
	for i, lf := range l.Files {
		if err := b.applyLogged(&lf); err != nil {
			return b.logErr(fmt.Errorf("file %d: %w", i, err))
		}
	}
	if _, err := b.commitRefs(context.Background(), false); err != nil {
		return b.logErr(err)
	}
	return nil
}

func (b *branch) logErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("branch %q: fold in the bytes its last fsync left in overlay files: %w (its last full commit is intact: a rollback to a snapshot drops them)", b.name, err)
}

// applyLogged makes one logged file whole again: its committed part plus
// the written ranges of its overlay file.
func (b *branch) applyLogged(lf *loggedFile) error {
	in := b.root
	for _, n := range lf.Path {
		if err := b.load(in); err != nil {
			return err
		}
		c := in.children[string(n)]
		if c == nil {
			return fmt.Errorf("%w: fsync log names %q, which the head does not hold", errCorrupt, n)
		}
		in = c
	}
	if in.typ != TypeFile {
		return fmt.Errorf("%w: fsync log names a %v", errCorrupt, in.typ)
	}
	fd, err := b.fileOf(in)
	if err != nil {
		return err
	}
	if fd.changed {
		return fmt.Errorf("%w: fsync log names one file twice", errCorrupt)
	}
	path := filepath.Join(b.dir, "overlay", lf.Overlay)
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if end := lf.Extents[len(lf.Extents)-1][1]; st.Size() < end {
		return fmt.Errorf("overlay %s holds %d bytes, the log wants %d", path, st.Size(), end)
	}
	fd.dirty = nil
	for _, x := range lf.Extents {
		fd.dirty = append(fd.dirty, extent{x[0], x[1]})
	}
	fd.ovPath, fd.changed = path, true
	in.size = lf.Size
	b.pend.overlays[path] = true
	return b.touch(in)
}

// foldLogs folds in the fsync logs of the branches that have one (after a
// crash). A branch whose log cannot be folded is left as it is: opening
// it reports why.
func (f *FS) foldLogs() {
	refs, err := f.store.ListRefs(refPending)
	if err != nil {
		return
	}
	for r, id := range refs {
		name := r[len(refPending):]
		if _, ok, err := f.getRef(refBranch + name); err == nil && !ok {
			f.store.DeleteRef(r, id) // the log of a deleted branch
			continue
		}
		if b, err := f.openBranch(name); err == nil {
			b.close()
		}
	}
}
