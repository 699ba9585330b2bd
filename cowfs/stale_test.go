package cowfs

import (
	"fmt"
	"strings"
	"testing"
)

// escapeMountinfo escapes a path as the kernel does in mountinfo.
func escapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\\':
			fmt.Fprintf(&b, `\%03o`, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// FuzzMountinfo decodes arbitrary mountinfo lines, and checks that a
// mount point and source survive the kernel's escaping.
func FuzzMountinfo(f *testing.F) {
	f.Add("36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - fuse.cowfs tine:main@0a1b2c3d4e5f rw", "/mnt/x y", "tine:pool@00")
	f.Add("1 2 3:4 / / rw - ext4 /dev/sda1 rw", `/a\b`, "")
	f.Add("- - - - - - - - -", "", "\\")
	f.Fuzz(func(t *testing.T, line, dir, source string) {
		parseMountinfo(line)
		if strings.ContainsAny(dir+source, "\x00") || dir == "" || source == "" {
			return
		}
		l := "36 35 98:0 / " + escapeMountinfo(dir) + " rw - fuse.cowfs " + escapeMountinfo(source) + " rw"
		e, ok := parseMountinfo(l)
		if !ok || e.dir != dir || e.source != source || e.fsType != fuseType {
			t.Fatalf("%q: got %+v, %v", l, e, ok)
		}
	})
}
