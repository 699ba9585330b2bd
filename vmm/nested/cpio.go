package nested

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/klauspost/compress/gzip"
)

// Archive builds an initramfs: a cpio archive in the "newc" format the
// kernel unpacks into its root filesystem. Parent directories are added
// as needed. The zero value is ready to use.
type Archive struct {
	buf  bytes.Buffer
	ino  uint32
	seen map[string]bool
	err  error
}

// Mode bits of cpio entries (the st_mode format bits).
const (
	cpioDir     = 0o040000
	cpioRegular = 0o100000
	cpioSymlink = 0o120000
)

// Dir adds a directory with mode 0755.
func (a *Archive) Dir(name string) {
	name = a.clean(name)
	if name == "" || a.seen[name] {
		return
	}
	a.parents(name)
	a.entry(name, cpioDir|0o755, nil)
}

// File adds a regular file with the permission bits of perm.
func (a *Archive) File(name string, perm fs.FileMode, data []byte) {
	name = a.clean(name)
	if name == "" {
		return
	}
	a.parents(name)
	a.entry(name, cpioRegular|uint32(perm.Perm()), data)
}

// Symlink adds a symbolic link to target.
func (a *Archive) Symlink(name, target string) {
	name = a.clean(name)
	if name == "" {
		return
	}
	a.parents(name)
	a.entry(name, cpioSymlink|0o777, []byte(target))
}

// Bytes returns the archive with its trailer, uncompressed.
func (a *Archive) Bytes() ([]byte, error) {
	if a.err != nil {
		return nil, a.err
	}
	out := bytes.Clone(a.buf.Bytes())
	var t bytes.Buffer
	writeEntry(&t, 0, "TRAILER!!!", 0, 1, nil)
	return append(out, t.Bytes()...), nil
}

// Gzip returns the archive gzip-compressed, as initrds usually are.
func (a *Archive) Gzip() ([]byte, error) {
	raw, err := a.Bytes()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	if err != nil {
		return nil, fmt.Errorf("initramfs gzip: %w", err)
	}
	if _, err := zw.Write(raw); err != nil {
		return nil, fmt.Errorf("initramfs gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("initramfs gzip: %w", err)
	}
	return out.Bytes(), nil
}

func (a *Archive) clean(name string) string {
	c := strings.TrimPrefix(path.Clean("/"+name), "/")
	if c == "" && a.err == nil && name != "/" && name != "" {
		a.err = fmt.Errorf("initramfs: bad path %q", name)
	}
	return c
}

func (a *Archive) parents(name string) {
	if dir := path.Dir(name); dir != "." {
		a.Dir(dir)
	}
}

func (a *Archive) entry(name string, mode uint32, data []byte) {
	if a.seen == nil {
		a.seen = map[string]bool{}
	}
	if a.seen[name] && a.err == nil {
		a.err = fmt.Errorf("initramfs: %q added twice", name)
		return
	}
	a.seen[name] = true
	a.ino++
	nlink := uint32(1)
	if mode&cpioDir != 0 {
		nlink = 2
	}
	writeEntry(&a.buf, a.ino, name, mode, nlink, data)
}

// writeEntry appends one newc header, the NUL-terminated name and the data,
// each padded to 4 bytes.
func writeEntry(b *bytes.Buffer, ino uint32, name string, mode, nlink uint32, data []byte) {
	fields := []uint32{ino, mode, 0, 0, nlink, 0, uint32(len(data)), 0, 0, 0, 0, uint32(len(name) + 1), 0}
	b.WriteString("070701")
	for _, f := range fields {
		fmt.Fprintf(b, "%08x", f)
	}
	b.WriteString(name)
	b.WriteByte(0)
	pad(b)
	b.Write(data)
	pad(b)
}

func pad(b *bytes.Buffer) {
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}
