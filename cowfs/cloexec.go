package cowfs

import (
	"os"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"tine/cowfs/internal/fuseuring"
)

// cloexecDevice marks srv's /dev/fuse descriptor close-on-exec. go-fuse
// opens the device without the flag, so a program this process executes
// (a helper, a sandbox's init step) would hold the mount's device, and a
// server of its own for it, until it exits. Where go-fuse's descriptor
// cannot be found, every descriptor on /dev/fuse is marked.
func cloexecDevice(srv *fuse.Server) {
	err := fuseuring.ControlDevice(srv, func(fd uintptr) {
		if fl, err := unix.FcntlInt(fd, unix.F_GETFD, 0); err == nil {
			unix.FcntlInt(fd, unix.F_SETFD, fl|unix.FD_CLOEXEC)
		}
	})
	if err != nil {
		cloexecFUSE()
	}
}

// cloexecFUSE marks every descriptor of this process open on /dev/fuse
// close-on-exec: a walk of /proc/self/fd, whose cost grows with the
// descriptors open (each sandbox holds some).
func cloexecFUSE() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		var fd int
		for _, c := range e.Name() {
			fd = fd*10 + int(c-'0')
		}
		// Most descriptors have the flag already (Go sets it): ask for it
		// first, which costs far less than reading the link.
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || fl&unix.FD_CLOEXEC != 0 {
			continue
		}
		if t, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && t == "/dev/fuse" {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, fl|unix.FD_CLOEXEC)
		}
	}
}
