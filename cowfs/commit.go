package cowfs

import (
	"context"
	"errors"
	"fmt"
	"io"

	"tine/chunkstore"
)

// commit writes what changed since the last commit and returns the new
// root object id. Caller holds b.mu.
func (b *branch) commit(ctx context.Context) (chunkstore.ID, error) {
	if !b.root.dirty && !b.head.IsZero() {
		return b.head, nil
	}
	if err := b.commitDir(ctx, b.root); err != nil {
		return chunkstore.ID{}, err
	}
	id, err := putRoot(b.fs.store, b.root.entry(rootName))
	if err != nil {
		return id, fmt.Errorf("branch %q: write root: %w", b.name, err)
	}
	return id, nil
}

// commitDir writes the dirty directories under top, children before
// parents. It walks with a stack of its own, so a tree of any depth
// commits. Each directory object written is charged to the quota: a
// commit of a changed directory stores all of it again.
func (b *branch) commitDir(ctx context.Context, top *inode) error {
	type frame struct {
		d        *inode
		path     []string // names from top, kept only while an fsync logs files
		expanded bool
	}
	stack := []frame{{d: top}}
	for len(stack) > 0 {
		i := len(stack) - 1
		d := stack[i].d
		if !d.dirty {
			stack = stack[:i]
			continue
		}
		if !stack[i].expanded {
			stack[i].expanded = true
			for name, c := range d.children {
				if c.typ == TypeDir && c.dirty {
					f := frame{d: c}
					if b.logging != nil {
						f.path = append(stack[i].path[:len(stack[i].path):len(stack[i].path)], name)
					}
					stack = append(stack, f)
				}
			}
			continue
		}
		path := stack[i].path
		stack = stack[:i]
		if err := ctx.Err(); err != nil {
			return err
		}
		entries := make([]Entry, 0, len(d.children))
		for name, c := range d.children {
			if b.logging != nil && c.typ == TypeFile && c.f != nil && b.logging.loggable(c.f) {
				le, ok, err := b.logFile(c, append(path[:len(path):len(path)], name))
				if err != nil {
					return err
				}
				if ok {
					e := c.entry(name)
					e.ID, e.Size = le.id, le.size
					entries = append(entries, e)
					continue
				}
			}
			if c.typ == TypeFile {
				if err := b.commitFile(ctx, c); err != nil {
					return err
				}
			}
			entries = append(entries, c.entry(name))
		}
		links, payload, err := encodeDir(entries)
		if err == nil {
			d.id, err = b.fs.store.PutNode(links, payload)
		}
		if err != nil {
			return fmt.Errorf("branch %q: write directory (inode %d): %w", b.name, d.ino, err)
		}
		d.dirty = false
		b.meta.UsedBytes += int64(len(payload) + len(links)*len(chunkstore.ID{}))
	}
	return nil
}

// commitFile turns a file's overlay into chunks (cutFile) and makes them
// its content. Caller holds b.mu.
func (b *branch) commitFile(ctx context.Context, in *inode) error {
	fd := in.f
	if fd == nil || !fd.changed {
		return nil
	}
	out, err := cutFile(ctx, b.fs.store, b.name, fd, in.size, func(p []byte, off int64) (int, error) {
		return b.readAt(in, p, off)
	})
	if err != nil {
		return err
	}
	return b.installFile(in, out)
}

// installFile makes refs, the chunks cutFile made of the file's content,
// its committed content. Caller holds b.mu.
func (b *branch) installFile(in *inode, refs []fileRef) error {
	id, err := putFile(b.fs.store, refs)
	if err != nil {
		return fmt.Errorf("branch %q: write file object: %w", b.name, err)
	}
	fd := in.f
	fd.setRefs(refs)
	fd.dirty = nil
	fd.changed = false
	b.dropOverlay(fd) // its bytes are in the store now
	in.id = id
	return nil
}

// cutFile stores a file's content (size bytes, read with read) as chunks
// and returns them: unchanged base chunks of fd are kept by reference;
// only runs of chunks that overlap written bytes, and the bytes past the
// base, are read and cut again. It reads fd and never changes it; name is
// the branch's, for errors.
func cutFile(ctx context.Context, st *chunkstore.Store, name string, fd *fileData, size int64, read readerAtFunc) ([]fileRef, error) {
	var out []fileRef
	n := len(fd.refs)
	i := 0
	for i < n {
		if !fd.overlaps(fd.offs[i], fd.offs[i+1]) {
			out = append(out, fd.refs[i])
			i++
			continue
		}
		j := i
		for j < n && fd.overlaps(fd.offs[j], fd.offs[j+1]) {
			j++
		}
		if j == n {
			break // the run reaches the end of the base: cut it with the tail
		}
		refs, err := chunkRegion(ctx, st, name, fd, read, fd.offs[i], fd.offs[j])
		if err != nil {
			return nil, err
		}
		out = append(out, refs...)
		i = j
	}
	if start := fd.offs[i]; start < size {
		refs, err := chunkRegion(ctx, st, name, fd, read, start, size)
		if err != nil {
			return nil, err
		}
		out = append(out, refs...)
	}
	return out, nil
}

// chunkRegion cuts [a, e) of the file's content into chunks; stretches
// that hold no data (holes of the base, never written, or punched) stay
// holes, one ref each whatever their length.
func chunkRegion(ctx context.Context, st *chunkstore.Store, name string, fd *fileData, read readerAtFunc, a, e int64) ([]fileRef, error) {
	var out []fileRef
	for a < e {
		data, next := fd.isData(a, e)
		next = min(next, e)
		if !data {
			out = appendHole(out, next-a)
			a = next
			continue
		}
		// Data up to the next hole.
		for next < e {
			d, n := fd.isData(next, e)
			if !d {
				break
			}
			next = min(n, e)
		}
		refs, err := st.PutStream(ctx, io.NewSectionReader(read, a, next-a))
		if err != nil {
			return nil, fmt.Errorf("branch %q: store file data: %w", name, err)
		}
		var got int64
		for _, r := range refs {
			got += int64(r.Size)
		}
		if got != next-a {
			return nil, fmt.Errorf("branch %q: store file data: stored %d bytes of %d", name, got, next-a)
		}
		out = append(out, fileRefs(refs)...)
		a = next
	}
	return out, nil
}

type readerAtFunc func(p []byte, off int64) (int, error)

func (f readerAtFunc) ReadAt(p []byte, off int64) (int, error) { return f(p, off) }

// checkpoint commits the branch, makes it durable and moves the branch
// ref. Every commit is durable (see commitRefs); durable says whether the
// caller needs that (fsync, unmount) or only the id (Head).
func (b *branch) checkpoint(ctx context.Context, durable bool) (chunkstore.ID, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.checkpointLocked(ctx, durable)
}

func (b *branch) checkpointLocked(ctx context.Context, _ bool) (chunkstore.ID, error) {
	return b.commitRefs(ctx, false)
}

// snapshot commits the branch and, in the same ref update, moves its head
// and keeps the result as a snapshot.
func (b *branch) snapshot(ctx context.Context) (chunkstore.ID, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.commitRefs(ctx, true)
}

// commitRefs commits the branch and moves its head ref (with keep also
// the snapshot ref of the new head, and the meta ref when the quota count
// changed) in one UpdateRefs, which makes the new objects durable in the
// same ref log record: one fdatasync. With nothing to update the branch is
// durable already: its head ref was set after its objects were durable.
func (b *branch) commitRefs(ctx context.Context, keep bool) (chunkstore.ID, error) {
	return b.commitWith(ctx, keep, false)
}

// commitWith is commitRefs; with logged, files with many written bytes go
// to the branch's fsync log instead of the store (fsynclog.go).
func (b *branch) commitWith(ctx context.Context, keep, logged bool) (chunkstore.ID, error) {
	if !b.bound() {
		return chunkstore.ID{}, errors.New("commit: mount is not bound to a branch")
	}
	if logged {
		b.logging = &logging{files: map[*fileData]loggedEntry{}}
		defer func() {
			// A logged file is still changed: the next commit stores it.
			for _, in := range b.logging.ins {
				b.dirtyUp(in)
			}
			b.logging = nil
		}()
	}
	id, err := b.commit(ctx)
	if err != nil {
		return id, err
	}
	if logged && len(b.logging.ins) > 0 {
		if err := b.makeLogDurable(); err != nil {
			return id, err
		}
	}
	logUp, newLog, moveLog, err := b.logUpdate(id)
	if err != nil {
		return id, err
	}
	for try := 0; ; try++ {
		var ups []chunkstore.RefUpdate
		if id != b.head {
			ups = append(ups, chunkstore.RefUpdate{Name: refBranch + b.name, Old: b.head, New: id})
		}
		if moveLog {
			ups = append(ups, logUp)
		}
		if b.meta != b.savedMeta {
			up, err := b.fs.metaUpdate(b.name, b.meta)
			if err != nil {
				return id, err
			}
			ups = append(ups, up)
		}
		if keep {
			cur, ok, err := b.fs.getRef(refSnap + id.String())
			if err != nil {
				return id, err
			}
			if !ok || cur != id {
				ups = append(ups, chunkstore.RefUpdate{Name: refSnap + id.String(), Old: cur, New: id})
			}
		}
		if len(ups) == 0 {
			break
		}
		err := b.fs.store.UpdateRefs(ups...)
		if err == nil {
			b.head, b.savedMeta = id, b.meta
			if moveLog {
				b.setLog(newLog)
			}
			return id, nil
		}
		// Only the snapshot ref can change under us (another branch
		// reaching the same tree): read it again.
		if !errors.Is(err, chunkstore.ErrConflict) || !keep || try > 5 {
			return id, fmt.Errorf("branch %q: move head: %w", b.name, err)
		}
	}
	return id, nil
}

// saveMeta writes the branch's settings if they changed. Caller holds b.mu.
func (b *branch) saveMeta() error {
	if b.meta == b.savedMeta {
		return nil
	}
	if err := b.fs.writeMeta(b.name, b.meta); err != nil {
		return fmt.Errorf("branch %q: %w", b.name, err)
	}
	b.savedMeta = b.meta
	return nil
}
