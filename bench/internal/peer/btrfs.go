package peer

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Btrfs is a btrfs filesystem on a sparse image file attached to a loop
// device and mounted at Dir.
type Btrfs struct {
	Image string // sparse image file
	Loop  string // loop device, e.g. /dev/loop3
	Dir   string // mount point
}

// NewBtrfs makes a sparse image of size bytes in work, formats it with
// mkfs.btrfs, attaches it to a free loop device and mounts it at work/mnt.
// Unmount, detach and removal are registered with cl.
func NewBtrfs(ctx context.Context, cl *Cleanups, work string, size int64) (*Btrfs, error) {
	if err := Require("mkfs.btrfs", "btrfs", "losetup"); err != nil {
		return nil, fmt.Errorf("btrfs peer: %w", err)
	}
	b := &Btrfs{Image: filepath.Join(work, "btrfs.img"), Dir: filepath.Join(work, "mnt")}
	f, err := os.Create(b.Image)
	if err != nil {
		return nil, fmt.Errorf("btrfs image %s: %w", b.Image, err)
	}
	cl.Add("btrfs image "+b.Image, func() error { return os.Remove(b.Image) })
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("btrfs image %s: %w", b.Image, err)
	}
	if _, err := Run(ctx, "", "mkfs.btrfs", "-q", "-f", b.Image); err != nil {
		return nil, fmt.Errorf("format %s: %w", b.Image, err)
	}
	out, err := Run(ctx, "", "losetup", "--find", "--show", b.Image)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", b.Image, err)
	}
	b.Loop = strings.TrimSpace(string(out))
	cl.Add("loop device "+b.Loop, func() error {
		_, err := Run(context.Background(), "", "losetup", "-d", b.Loop)
		return err
	})
	if err := os.MkdirAll(b.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("btrfs mount point %s: %w", b.Dir, err)
	}
	if err := unix.Mount(b.Loop, b.Dir, "btrfs", 0, ""); err != nil {
		return nil, fmt.Errorf("mount %s (%s) on %s: %w", b.Loop, b.Image, b.Dir, err)
	}
	cl.Add("btrfs mount "+b.Dir, func() error { return Unmount(b.Dir) })
	return b, nil
}

// CreateSubvolume makes an empty subvolume at path (inside b.Dir).
func (b *Btrfs) CreateSubvolume(ctx context.Context, path string) error {
	if _, err := Run(ctx, "", "btrfs", "-q", "subvolume", "create", path); err != nil {
		return fmt.Errorf("btrfs subvolume %s: %w", path, err)
	}
	return nil
}

// btrfs ioctl ABI (linux/btrfs.h): struct btrfs_ioctl_vol_args_v2 is 4096
// bytes and BTRFS_IOC_SNAP_CREATE_V2 is _IOW(0x94, 23, that struct).
const (
	btrfsIocSnapCreateV2 = 0x50009417
	btrfsSubvolRdonly    = 1 << 1
)

type btrfsVolArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// The struct is exactly 4096 bytes: both array lengths must be >= 0.
var (
	_ [4096 - unsafe.Sizeof(btrfsVolArgsV2{})]byte
	_ [unsafe.Sizeof(btrfsVolArgsV2{}) - 4096]byte
)

// Snapshot makes a snapshot of subvolume src at dst with one
// BTRFS_IOC_SNAP_CREATE_V2 ioctl (what `btrfs subvolume snapshot` does,
// without its process start). A read-only snapshot when readonly is set,
// a writable one (a fork) otherwise.
func Snapshot(src, dst string, readonly bool) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("btrfs snapshot source %s: %w", src, err)
	}
	defer unix.Close(sfd)
	parent, name := filepath.Dir(dst), filepath.Base(dst)
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("btrfs snapshot target dir %s: %w", parent, err)
	}
	defer unix.Close(pfd)
	var args btrfsVolArgsV2
	args.fd = int64(sfd)
	if readonly {
		args.flags = btrfsSubvolRdonly
	}
	if len(name) >= len(args.name) {
		return fmt.Errorf("btrfs snapshot %s: name too long", dst)
	}
	copy(args.name[:], name)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(pfd), btrfsIocSnapCreateV2, uintptr(unsafe.Pointer(&args))); errno != 0 {
		return fmt.Errorf("btrfs snapshot %s -> %s: %w", src, dst, errno)
	}
	return nil
}

// Send runs `btrfs send -p parent snap` (both read-only snapshots) and
// returns the size of the stream, as `| wc -c` would.
func Send(ctx context.Context, parent, snap string) (int64, error) {
	var n countWriter
	var errb strings.Builder
	if err := RunTo(ctx, "", nil, &n, &errb, "btrfs", "send", "-q", "-p", parent, snap); err != nil {
		return 0, fmt.Errorf("btrfs send -p %s %s: %w: %s", parent, snap, err, tail(errb.String(), 400))
	}
	return int64(n), nil
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}

var _ io.Writer = (*countWriter)(nil)
