package guestagent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MountShare mounts the virtio-fs device tagged tag at dir (made when
// missing). A mount already there is kept when it answers: in a VM clone
// the device carried its parent's session over (its server took over the
// parent's node ids and open files), so the processes using the project
// go on. One that does not answer (a clone of an image saved without the
// share's state) is unmounted and mounted again, which opens a session
// with the clone's own server; that is impossible while a process has a
// file open or its working directory in it, which is an error naming the
// path (docs/fork-hygiene.md).
func MountShare(tag, dir string) error { return mountShare(tag, dir, "virtiofs") }

func mountShare(tag, dir, fstype string) error {
	// Unmount first: a stat of the old mount's root can fail (its server
	// is gone), which would make MkdirAll fail too.
	mounted, err := isMountPoint(dir)
	if err != nil {
		return fmt.Errorf("guestagent: project share: %w", err)
	}
	var st unix.Statfs_t
	if mounted && unix.Statfs(dir, &st) == nil {
		return nil
	}
	if mounted {
		if err := unix.Unmount(dir, 0); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("guestagent: remount the project share at %s: it is busy (a process has a file open or its working directory in it from before the fork); end such processes before forking, or run them outside the project", dir)
			}
			return fmt.Errorf("guestagent: unmount the project share at %s: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("guestagent: project share: %w", err)
	}
	if err := unix.Mount(tag, dir, fstype, unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("guestagent: mount the project share %q (%s) at %s: %w", tag, fstype, dir, err)
	}
	return nil
}

// isMountPoint reports whether dir is a mount point, from
// /proc/self/mountinfo (a stat of a mount whose server is gone fails).
func isMountPoint(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && unescapeMountPath(fields[4]) == dir {
			return true, nil
		}
	}
	return false, s.Err()
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(p string) string {
	if !strings.Contains(p, `\`) {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' && i+3 < len(p) {
			if v, err := strconv.ParseUint(p[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}
