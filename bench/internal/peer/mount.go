package peer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DropCaches writes back dirty data and drops the kernel's page, dentry and
// inode caches, so the next read comes from the device. It needs root.
// Caches kept in user space (a FUSE server's own) are not affected.
func DropCaches() error {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		return fmt.Errorf("drop caches via /proc/sys/vm/drop_caches: %w", err)
	}
	return nil
}

// Mounted reports whether dir is a mount point, from /proc/self/mountinfo.
func Mounted(dir string) (bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, fmt.Errorf("mount point %s: %w", dir, err)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == abs {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	return false, nil
}

// unescapeMount undoes the octal escapes (\040 for a space) that
// /proc/self/mountinfo uses in paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			v := 0
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + int(c-'0')
			}
			if ok {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Unmount unmounts dir, retrying for a while when it is busy and falling
// back to a lazy unmount, so that cleanup never leaves a mount behind.
// A dir that is not mounted is not an error.
func Unmount(dir string) error {
	var err error
	for i := 0; i < 20; i++ {
		err = unix.Unmount(dir, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if lerr := unix.Unmount(dir, unix.MNT_DETACH); lerr != nil && !errors.Is(lerr, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w (lazy: %v)", dir, err, lerr)
	}
	return nil
}

// Overlay is one kernel overlayfs mount.
type Overlay struct {
	Lower []string // lower layers, topmost first
	Upper string   // writable layer
	Work  string   // overlayfs work dir, on the same filesystem as Upper
	Dir   string   // mount point
}

// MountOverlay creates upper, work and dir when missing and mounts a kernel
// overlayfs there. The unmount is registered with cl.
func MountOverlay(cl *Cleanups, o Overlay) error {
	for _, d := range []string{o.Upper, o.Work, o.Dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("overlay dir %s: %w", d, err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(o.Lower, ":"), o.Upper, o.Work)
	if err := unix.Mount("overlay", o.Dir, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlayfs on %s (%s): %w", o.Dir, opts, err)
	}
	cl.Add("overlayfs "+o.Dir, func() error { return Unmount(o.Dir) })
	return nil
}

// MountFuseOverlay mounts fuse-overlayfs (the user-space overlay) with the
// layers of o and waits until the mount is visible. The unmount is
// registered with cl.
func MountFuseOverlay(ctx context.Context, cl *Cleanups, o Overlay) error {
	for _, d := range []string{o.Upper, o.Work, o.Dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("fuse-overlayfs dir %s: %w", d, err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(o.Lower, ":"), o.Upper, o.Work)
	// fuse-overlayfs daemonizes once the mount is in place.
	if _, err := Run(ctx, "", "fuse-overlayfs", "-o", opts, o.Dir); err != nil {
		return fmt.Errorf("mount fuse-overlayfs on %s: %w", o.Dir, err)
	}
	cl.Add("fuse-overlayfs "+o.Dir, func() error { return Unmount(o.Dir) })
	return WaitMounted(ctx, o.Dir)
}

// WaitMounted polls until dir is a mount point or ctx ends (at most 10 s).
func WaitMounted(ctx context.Context, dir string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		ok, err := Mounted(dir)
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for mount on %s: %w", dir, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// FSType names the filesystem that holds path (ext4, btrfs, tmpfs, ...).
func FSType(path string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", path, err)
	}
	names := map[int64]string{
		0xEF53: "ext4", 0x9123683E: "btrfs", 0x01021994: "tmpfs", 0x58465342: "xfs",
		0x794c7630: "overlayfs", 0x65735546: "fuse", 0x6969: "nfs", 0x2FC12FC1: "zfs",
	}
	if n, ok := names[int64(st.Type)]; ok {
		return n, nil
	}
	return fmt.Sprintf("0x%x", st.Type), nil
}
