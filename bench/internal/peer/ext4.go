package peer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Ext4 is an ext4 filesystem on a sparse image file attached to a loop
// device and mounted at Dir: the native floor the other filesystems are
// measured against, on the same disk and free of the host root's mount
// options.
type Ext4 struct {
	Image string // sparse image file
	Loop  string // loop device, e.g. /dev/loop3
	Dir   string // mount point
}

// NewExt4 makes a sparse image of size bytes in work, formats it with
// mkfs.ext4 (no lazy init, so no background zeroing competes with the
// measurements), attaches it to a free loop device and mounts it at
// work/mnt. Unmount, detach and removal are registered with cl.
func NewExt4(ctx context.Context, cl *Cleanups, work string, size int64) (*Ext4, error) {
	if err := Require("mkfs.ext4", "losetup"); err != nil {
		return nil, fmt.Errorf("ext4 peer: %w", err)
	}
	x := &Ext4{Image: filepath.Join(work, "ext4.img"), Dir: filepath.Join(work, "mnt")}
	f, err := os.Create(x.Image)
	if err != nil {
		return nil, fmt.Errorf("ext4 image %s: %w", x.Image, err)
	}
	cl.Add("ext4 image "+x.Image, func() error { return os.Remove(x.Image) })
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("ext4 image %s: %w", x.Image, err)
	}
	if _, err := Run(ctx, "", "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", x.Image); err != nil {
		return nil, fmt.Errorf("format %s: %w", x.Image, err)
	}
	out, err := Run(ctx, "", "losetup", "--find", "--show", x.Image)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", x.Image, err)
	}
	x.Loop = strings.TrimSpace(string(out))
	cl.Add("loop device "+x.Loop, func() error {
		_, err := Run(context.Background(), "", "losetup", "-d", x.Loop)
		return err
	})
	if err := os.MkdirAll(x.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("ext4 mount point %s: %w", x.Dir, err)
	}
	if err := unix.Mount(x.Loop, x.Dir, "ext4", 0, ""); err != nil {
		return nil, fmt.Errorf("mount %s (%s) on %s: %w", x.Loop, x.Image, x.Dir, err)
	}
	cl.Add("ext4 mount "+x.Dir, func() error { return Unmount(x.Dir) })
	return x, nil
}

// Remount unmounts and mounts the filesystem again, so that the next read
// is the first after a mount.
func (x *Ext4) Remount() error {
	if err := unix.Unmount(x.Dir, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", x.Dir, err)
	}
	if err := unix.Mount(x.Loop, x.Dir, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount %s on %s again: %w", x.Loop, x.Dir, err)
	}
	return nil
}
