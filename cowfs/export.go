package cowfs

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
)

// maxPatchFile bounds the size of a file that WritePatch diffs line by
// line; bigger files are reported as binary.
const maxPatchFile = 16 << 20

// readContent returns the bytes of a file or symlink entry.
func (f *FS) readContent(e *Entry) ([]byte, error) {
	switch e.Type {
	case TypeSymlink:
		return []byte(e.Target), nil
	case TypeFile:
		refs, size, err := getFile(f.store, e.ID)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(f.store.NewReader(refs), buf); err != nil {
			return nil, fmt.Errorf("read file object %s: %w", e.ID, err)
		}
		return buf, nil
	}
	return nil, nil
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

func gitMode(e *Entry) string {
	switch e.Type {
	case TypeSymlink:
		return "120000"
	case TypeDir:
		return "040000"
	}
	if e.Mode&0o111 != 0 {
		return "100755"
	}
	return "100644"
}

func isText(b []byte) bool {
	return len(b) <= maxPatchFile && bytes.IndexByte(b[:min(len(b), 8000)], 0) < 0
}

// WritePatch writes the changes from a to b as a unified patch with git's
// extended headers (new/deleted file mode, old/new mode). Binary files are
// named, not shown; directories, fifos and device nodes appear only as
// mode lines.
func (f *FS) WritePatch(ctx context.Context, w io.Writer, a, b SnapshotID) error {
	changes, err := f.Diff(ctx, a, b)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return err
		}
		if c.Path == "" {
			continue
		}
		if err := f.patchOne(bw, c); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func hasContent(e *Entry) bool {
	return e != nil && (e.Type == TypeFile || e.Type == TypeSymlink)
}

func (f *FS) patchOne(w *bufio.Writer, c Change) error {
	old, nw := c.Old, c.New
	if c.Kind == TypeChanged {
		// Show as a deletion then an addition.
		if err := f.patchOne(w, Change{Path: c.Path, Kind: Deleted, Old: old}); err != nil {
			return err
		}
		return f.patchOne(w, Change{Path: c.Path, Kind: Added, New: nw})
	}
	if (old != nil && old.Type == TypeDir) || (nw != nil && nw.Type == TypeDir) {
		return nil // directories carry no content; their entries follow
	}
	ap, bp := quotePath("a/"+c.Path), quotePath("b/"+c.Path)
	fmt.Fprintf(w, "diff --git %s %s\n", ap, bp)
	switch c.Kind {
	case Added:
		fmt.Fprintf(w, "new file mode %s\n", gitMode(nw))
	case Deleted:
		fmt.Fprintf(w, "deleted file mode %s\n", gitMode(old))
	default:
		if gitMode(old) != gitMode(nw) || old.Mode != nw.Mode {
			fmt.Fprintf(w, "old mode %s\nnew mode %s\n", gitMode(old), gitMode(nw))
		}
	}
	if c.Kind == ModeChanged || !(hasContent(old) || hasContent(nw)) {
		return nil
	}
	var ab, bb []byte
	var err error
	if hasContent(old) {
		if ab, err = f.readContent(old); err != nil {
			return err
		}
	}
	if hasContent(nw) {
		if bb, err = f.readContent(nw); err != nil {
			return err
		}
	}
	from, to := ap, bp
	if old == nil {
		from = "/dev/null"
	}
	if nw == nil {
		to = "/dev/null"
	}
	if !isText(ab) || !isText(bb) {
		fmt.Fprintf(w, "Binary files %s and %s differ\n", from, to)
		return nil
	}
	fmt.Fprintf(w, "--- %s\n+++ %s\n", from, to)
	writeHunks(w, splitLines(ab), splitLines(bb), 3)
	return nil
}

// splitLines splits b after each newline; the last line may lack one.
func splitLines(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			out = append(out, string(b))
			break
		}
		out = append(out, string(b[:i+1]))
		b = b[i+1:]
	}
	return out
}

// editOp is one step of a line edit script.
type editOp struct {
	kind byte // ' ', '-', '+'
	line string
}

// diffLines computes a shortest edit script from a to b (Myers' greedy
// algorithm). Past maxD differences it gives up on finding the shortest
// script and replaces the rest wholesale.
func diffLines(a, b []string) []editOp {
	// Trim a common prefix and suffix first: cheap and usually most lines.
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	var ops []editOp
	for _, l := range a[:pre] {
		ops = append(ops, editOp{' ', l})
	}
	ops = append(ops, myers(a[pre:len(a)-suf], b[pre:len(b)-suf])...)
	for _, l := range a[len(a)-suf:] {
		ops = append(ops, editOp{' ', l})
	}
	return ops
}

func myers(a, b []string) []editOp {
	n, m := len(a), len(b)
	const maxD = 4000
	max := n + m
	if max == 0 {
		return nil
	}
	var trace [][]int
	off := max
	v := make([]int, 2*max+2)
	found := -1
	for d := 0; d <= max && d <= maxD; d++ {
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				found = d
				break
			}
		}
		// Keep the band [-d, d] of v for the backtrack.
		snap := make([]int, 2*d+1)
		copy(snap, v[off-d:off+d+1])
		trace = append(trace, snap)
		if found >= 0 {
			break
		}
	}
	if found < 0 {
		ops := make([]editOp, 0, n+m)
		for _, l := range a {
			ops = append(ops, editOp{'-', l})
		}
		for _, l := range b {
			ops = append(ops, editOp{'+', l})
		}
		return ops
	}
	get := func(d, k int) int { return trace[d][k+d] }
	var rev []editOp
	x, y := n, m
	for d := found; d > 0; d-- {
		k := x - y
		var pk int
		if k == -d || (k != d && get(d-1, k-1) < get(d-1, k+1)) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := get(d-1, pk)
		py := px - pk
		for x > px && y > py {
			x--
			y--
			rev = append(rev, editOp{' ', a[x]})
		}
		if x == px {
			y--
			rev = append(rev, editOp{'+', b[y]})
		} else {
			x--
			rev = append(rev, editOp{'-', a[x]})
		}
	}
	for x > 0 && y > 0 {
		x--
		y--
		rev = append(rev, editOp{' ', a[x]})
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

// writeHunks writes the edit script from a to b as unified-diff hunks.
func writeHunks(w *bufio.Writer, a, b []string, ctxLines int) {
	ops := diffLines(a, b)
	i := 0
	ai, bi := 0, 0 // line numbers (0-based) at ops[i]
	for i < len(ops) {
		// Find the next change.
		for i < len(ops) && ops[i].kind == ' ' {
			i++
			ai++
			bi++
		}
		if i >= len(ops) {
			return
		}
		start := max(i-ctxLines, 0)
		// Extend while changes are within 2*ctxLines of each other.
		end := i
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := 0
			for end+run < len(ops) && ops[end+run].kind == ' ' {
				run++
			}
			if end+run >= len(ops) || run > 2*ctxLines {
				end += min(run, ctxLines)
				break
			}
			end += run
		}
		back := i - start
		as, bs := ai-back, bi-back
		var al, bl int
		for _, op := range ops[start:end] {
			if op.kind != '+' {
				al++
			}
			if op.kind != '-' {
				bl++
			}
		}
		fmt.Fprintf(w, "@@ -%s +%s @@\n", hunkRange(as, al), hunkRange(bs, bl))
		for _, op := range ops[start:end] {
			w.WriteByte(op.kind)
			w.WriteString(op.line)
			if !strings.HasSuffix(op.line, "\n") {
				w.WriteString("\n\\ No newline at end of file\n")
			}
		}
		for _, op := range ops[i:end] {
			if op.kind != '+' {
				ai++
			}
			if op.kind != '-' {
				bi++
			}
		}
		i = end
	}
}

func hunkRange(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if n == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}

// WriteTar writes the entries added or changed from a to b as a tar
// stream (full content of each changed file, directories, symlinks,
// fifos and device nodes, user xattrs as PAX records) and marks each
// deleted path with an OCI-style whiteout entry (dir/.wh.name). It returns
// the deleted paths.
func (f *FS) WriteTar(ctx context.Context, w io.Writer, a, b SnapshotID) ([]string, error) {
	changes, err := f.Diff(ctx, a, b)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(w)
	var deleted []string
	for _, c := range changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if c.Path == "" {
			continue
		}
		if c.Kind == Deleted {
			deleted = append(deleted, c.Path)
			dir, name := path.Split(c.Path)
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dir + ".wh." + name, Mode: 0o644, Format: tar.FormatPAX}); err != nil {
				return nil, fmt.Errorf("write tar: %w", err)
			}
			continue
		}
		if err := f.tarEntry(tw, c.Path, c.New); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write tar: %w", err)
	}
	return deleted, nil
}

func (f *FS) tarEntry(tw *tar.Writer, p string, e *Entry) error {
	h := &tar.Header{
		Name:    p,
		Mode:    int64(e.Mode),
		Uid:     int(e.UID),
		Gid:     int(e.GID),
		ModTime: time.Unix(0, e.MtimeNs),
		Format:  tar.FormatPAX,
	}
	for _, x := range e.Xattrs {
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+x.Name] = string(x.Value)
	}
	switch e.Type {
	case TypeDir:
		h.Typeflag, h.Name = tar.TypeDir, p+"/"
	case TypeSymlink:
		h.Typeflag, h.Linkname = tar.TypeSymlink, e.Target
	case TypeFifo:
		h.Typeflag = tar.TypeFifo
	case TypeChar, TypeBlock:
		h.Typeflag = tar.TypeChar
		if e.Type == TypeBlock {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor = int64((e.Rdev >> 8) & 0xfff)
		h.Devminor = int64((e.Rdev & 0xff) | ((e.Rdev >> 12) & 0xfff00))
	case TypeSocket:
		return nil // tar cannot hold sockets
	default:
		h.Typeflag = tar.TypeReg
		h.Size = e.Size
	}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("write tar header for %q: %w", p, err)
	}
	if e.Type == TypeFile && e.Size > 0 {
		refs, _, err := getFile(f.store, e.ID)
		if err != nil {
			return err
		}
		if _, err := io.Copy(tw, f.store.NewReader(refs)); err != nil {
			return fmt.Errorf("write tar body of %q: %w", p, err)
		}
	}
	return nil
}
