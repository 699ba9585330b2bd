// Package strayfd closes descriptors a long-lived helper process
// inherited by accident. A descriptor that a library opened without
// O_CLOEXEC while another thread started the helper passes exec; held by
// the helper, one on a FUSE mount keeps that mount busy and its
// connection alive for as long as the helper lives.
package strayfd

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Close closes every descriptor numbered from or above that is not
// close-on-exec: call it first thing in a program started by exec, where
// any such descriptor above those it was given came from its parent by
// accident (the Go runtime's own are all close-on-exec).
func Close(from int) error {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close() // close-on-exec, as os opens every file: never stray
	if err != nil {
		return err
	}
	var stray []int
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd < from {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			stray = append(stray, fd)
		}
	}
	for _, fd := range stray {
		unix.Close(fd)
	}
	return nil
}
