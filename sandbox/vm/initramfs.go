package vm

import (
	"bytes"
	"fmt"
	"path"
	"strings"
)

// initramfs builds an uncompressed cpio archive ("newc") that the kernel
// unpacks into its root filesystem. Parent directories are added as
// needed.
type initramfs struct {
	buf  bytes.Buffer
	ino  uint32
	seen map[string]bool
}

func (a *initramfs) entry(name string, mode uint32, data []byte) {
	a.ino++
	fmt.Fprintf(&a.buf, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		a.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	a.buf.WriteString(name)
	a.buf.WriteByte(0)
	a.pad()
	a.buf.Write(data)
	a.pad()
}

func (a *initramfs) pad() {
	for a.buf.Len()%4 != 0 {
		a.buf.WriteByte(0)
	}
}

func (a *initramfs) dir(name string) {
	if a.seen == nil {
		a.seen = map[string]bool{}
	}
	if name == "." || name == "/" || name == "" || a.seen[name] {
		return
	}
	a.dir(path.Dir(name))
	a.seen[name] = true
	a.entry(name, 0o040755, nil)
}

func (a *initramfs) file(name string, mode uint32, data []byte) {
	name = strings.TrimPrefix(name, "/")
	a.dir(path.Dir(name))
	a.entry(name, 0o100000|mode, data)
}

// bytes ends the archive with its trailer.
func (a *initramfs) bytes() []byte {
	a.entry("TRAILER!!!", 0, nil)
	for a.buf.Len()%512 != 0 {
		a.buf.WriteByte(0)
	}
	return a.buf.Bytes()
}
