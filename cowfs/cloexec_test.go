package cowfs

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMountDeviceCloexec: after mounts, no descriptor of this process on
// /dev/fuse lacks close-on-exec (a program started later would hold the
// mount's device).
func TestMountDeviceCloexec(t *testing.T) {
	f := openTestFS(t)
	for _, name := range []string{"a", "b"} {
		mountNew(t, f, name, map[string]string{"x": "1"})
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	devices := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || l != "/dev/fuse" {
			continue
		}
		devices++
		var fd int
		for _, c := range e.Name() {
			fd = fd*10 + int(c-'0')
		}
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && fl&unix.FD_CLOEXEC == 0 {
			t.Errorf("descriptor %d on /dev/fuse lacks close-on-exec", fd)
		}
	}
	if devices < 2 {
		t.Errorf("%d descriptors on /dev/fuse with two mounts up, want at least 2", devices)
	}
}
