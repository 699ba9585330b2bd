package cowfs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"tine/cowfs/internal/textdiff"
)

// DefaultMaxPatchFile is the largest file a patch carries unless
// PatchOptions.MaxFile says otherwise.
const DefaultMaxPatchFile = 64 << 20

const (
	// maxTextDiff bounds the files diffed line by line; bigger files are
	// written as git binary patches.
	maxTextDiff = 1 << 20
	// sniffLen is how much of a file is searched for a NUL byte, which
	// makes it binary (as git decides).
	sniffLen = 8000
)

// ErrPatchTooBig is returned (wrapped, naming the file) by WritePatch for
// a file over PatchOptions.MaxFile.
var ErrPatchTooBig = errors.New("file too big for a patch")

// nullBlob is git's id for "no file" in index lines.
const nullBlob = "0000000000000000000000000000000000000000"

// PatchOptions says what WritePatch carries.
type PatchOptions struct {
	DiffOptions
	// MaxFile is the largest file, before or after the change, that the
	// patch carries (git apply needs binary files whole in the patch);
	// 0 means DefaultMaxPatchFile.
	MaxFile int64
}

// WritePatch writes the changes from a to b (as DiffWith with
// opts.DiffOptions lists them) as a patch that git apply accepts: git's
// extended headers, full index lines with git blob ids, unified hunks for
// text and "GIT binary patch" literals for binary files and for files over
// 1 MiB. A file over opts.MaxFile fails the patch before anything is
// written. Memory stays bounded: binary files are streamed.
//
// What a patch cannot express is left out and returned: fifos, devices
// and sockets, modes other than 644 and 755, owners, xattrs and directory
// metadata. Symlinks and executable bits are carried.
func (f *FS) WritePatch(ctx context.Context, w io.Writer, a, b SnapshotID, opts PatchOptions) ([]Refusal, error) {
	changes, err := f.DiffWith(ctx, a, b, opts.DiffOptions)
	if err != nil {
		return nil, err
	}
	limit := opts.MaxFile
	if limit <= 0 {
		limit = DefaultMaxPatchFile
	}
	for _, c := range changes {
		if c.Kind == ModeChanged {
			continue // no content is written
		}
		for _, e := range []*Entry{c.Old, c.New} {
			if e != nil && e.Type == TypeFile && e.Size > limit {
				return nil, fmt.Errorf("%s (%d bytes): %w: the limit is %d bytes; export the change with export-tar, or raise the limit (--max-file)", quotePath(c.Path), e.Size, ErrPatchTooBig, limit)
			}
		}
	}
	p := &patcher{f: f, w: bufio.NewWriter(w)}
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if c.Path == "" {
			if c.Kind == ModeChanged {
				p.leave(c.Path, "top directory metadata changed; a patch does not carry it")
			}
			continue
		}
		if err := p.change(c); err != nil {
			return nil, err
		}
	}
	if err := p.w.Flush(); err != nil {
		return nil, fmt.Errorf("write patch: %w", err)
	}
	return p.left, nil
}

type patcher struct {
	f    *FS
	w    *bufio.Writer
	left []Refusal
}

func (p *patcher) leave(path, reason string) {
	p.left = append(p.left, Refusal{Path: path, Reason: reason})
}

func hasContent(e *Entry) bool {
	return e != nil && (e.Type == TypeFile || e.Type == TypeSymlink)
}

// gitMode is the mode git records for e: 120000 for a symlink, 100755 for
// a file with any execute bit, else 100644.
func gitMode(e *Entry) string {
	switch {
	case e.Type == TypeSymlink:
		return "120000"
	case e.Mode&0o111 != 0:
		return "100755"
	}
	return "100644"
}

// exactGitMode reports whether gitMode says all of e's mode.
func exactGitMode(e *Entry) bool {
	m := e.Mode & 0o7777
	return e.Type == TypeSymlink || m == 0o644 || m == 0o755
}

func (p *patcher) change(c Change) error {
	old, nw := c.Old, c.New
	if c.Kind == TypeChanged {
		// git shows a change of type as a deletion then an addition.
		if err := p.change(Change{Path: c.Path, Kind: Deleted, Old: old}); err != nil {
			return err
		}
		return p.change(Change{Path: c.Path, Kind: Added, New: nw})
	}
	if (old != nil && old.Type == TypeDir) || (nw != nil && nw.Type == TypeDir) {
		// Directories follow from the files in them.
		if c.Kind == ModeChanged {
			p.leave(c.Path, "directory mode, owner or xattrs changed; a patch does not carry them")
		}
		return nil
	}
	for _, e := range []*Entry{old, nw} {
		if e != nil && !hasContent(e) {
			p.leave(c.Path, fmt.Sprintf("%s %s: a patch carries only regular files and symlinks", c.Kind, e.Type))
			return nil
		}
	}
	if nw != nil && (old == nil || old.Mode != nw.Mode) && !exactGitMode(nw) {
		p.leave(c.Path, fmt.Sprintf("mode %04o is written as %s (a patch carries only 644, 755 and symlinks)", nw.Mode, gitMode(nw)))
	}
	if old != nil && nw != nil && (old.UID != nw.UID || old.GID != nw.GID || !sameXattrs(old, nw)) {
		p.leave(c.Path, "owner or xattrs changed; a patch does not carry them")
	}
	modeLines := old != nil && nw != nil && gitMode(old) != gitMode(nw)
	if c.Kind == ModeChanged && !modeLines {
		return nil // nothing git can express changed
	}
	w := p.w
	ap, bp := quotePath("a/"+c.Path), quotePath("b/"+c.Path)
	fmt.Fprintf(w, "diff --git %s %s\n", ap, bp)
	switch {
	case old == nil:
		fmt.Fprintf(w, "new file mode %s\n", gitMode(nw))
	case nw == nil:
		fmt.Fprintf(w, "deleted file mode %s\n", gitMode(old))
	case modeLines:
		fmt.Fprintf(w, "old mode %s\nnew mode %s\n", gitMode(old), gitMode(nw))
	}
	if c.Kind == ModeChanged {
		return nil
	}
	oldSide, err := p.f.side(old)
	if err != nil {
		return fmt.Errorf("patch %s: %w", c.Path, err)
	}
	newSide, err := p.f.side(nw)
	if err != nil {
		return fmt.Errorf("patch %s: %w", c.Path, err)
	}
	fmt.Fprintf(w, "index %s..%s", oldSide.blob, newSide.blob)
	if old != nil && nw != nil {
		fmt.Fprintf(w, " %s", gitMode(nw))
	}
	w.WriteByte('\n')
	from, to := ap, bp
	if old == nil {
		from = "/dev/null"
	}
	if nw == nil {
		to = "/dev/null"
	}
	switch {
	case oldSide.text && newSide.text:
		if len(oldSide.data)+len(newSide.data) > 0 {
			fmt.Fprintf(w, "--- %s\n+++ %s\n", from, to)
			textdiff.Unified(w, oldSide.data, newSide.data, 3)
		}
	default:
		w.WriteString("GIT binary patch\n")
		var r io.Reader = bytes.NewReader(nil)
		var size int64
		if nw != nil {
			if r, err = p.f.sideReader(nw, newSide); err != nil {
				return fmt.Errorf("patch %s: %w", c.Path, err)
			}
			size = entrySize(nw)
		}
		if err := writeBinaryHunk(w, r, size); err != nil {
			return fmt.Errorf("patch %s: %w", c.Path, err)
		}
	}
	return nil
}

// sameXattrs reports whether a and b carry the same xattrs.
func sameXattrs(a, b *Entry) bool {
	x := *a
	x.Mode, x.UID, x.GID = b.Mode, b.UID, b.GID
	return sameMeta(&x, b)
}

// patchSide is one side of a content change: its git blob id, whether it
// is diffed as text, and its bytes when they were read (text only).
type patchSide struct {
	blob string
	text bool
	data []byte
}

// side reads what a patch needs of e (nil: the absent side). Symlinks and
// files up to maxTextDiff without a NUL in their first sniffLen bytes are
// text and read whole; other files are hashed as a stream.
func (f *FS) side(e *Entry) (patchSide, error) {
	switch {
	case e == nil:
		return patchSide{blob: nullBlob, text: true}, nil
	case e.Type == TypeSymlink:
		data := []byte(e.Target)
		return patchSide{blob: blobID(data), text: true, data: data}, nil
	case e.Size <= maxTextDiff:
		data, err := f.readSmall(e)
		if err != nil {
			return patchSide{}, err
		}
		text := bytes.IndexByte(data[:min(len(data), sniffLen)], 0) < 0
		return patchSide{blob: blobID(data), text: text, data: data}, nil
	}
	r, err := f.contentReader(e)
	if err != nil {
		return patchSide{}, err
	}
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", e.Size)
	if _, err := io.Copy(h, r); err != nil {
		return patchSide{}, fmt.Errorf("read file object %s: %w", e.ID, err)
	}
	return patchSide{blob: hex.EncodeToString(h.Sum(nil))}, nil
}

// sideReader returns e's content again, from memory when side holds it.
func (f *FS) sideReader(e *Entry, s patchSide) (io.Reader, error) {
	if s.data != nil {
		return bytes.NewReader(s.data), nil
	}
	return f.contentReader(e)
}

// blobID is git's object id of a blob holding data.
func blobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// entrySize is the length of e's content: the file size or the symlink
// target's length.
func entrySize(e *Entry) int64 {
	if e.Type == TypeSymlink {
		return int64(len(e.Target))
	}
	return e.Size
}

// contentReader streams the content of a file or symlink entry.
func (f *FS) contentReader(e *Entry) (io.Reader, error) {
	if e.Type == TypeSymlink {
		return strings.NewReader(e.Target), nil
	}
	refs, size, err := getFile(f.store, e.ID)
	if err != nil {
		return nil, err
	}
	if size != e.Size {
		return nil, fmt.Errorf("file object %s: %w: holds %d bytes, its entry says %d", e.ID, errCorrupt, size, e.Size)
	}
	return newFileReader(f.store, refs), nil
}

// quotePath quotes a path the way git does when it holds control bytes,
// quotes, backslashes or non-ASCII bytes; other paths are returned as is.
func quotePath(p string) string {
	plain := true
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			plain = false
			break
		}
	}
	if plain {
		return p
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if c < 0x20 || c >= 0x7f {
				fmt.Fprintf(&b, "\\%03o", c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
