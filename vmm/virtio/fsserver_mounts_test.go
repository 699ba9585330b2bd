package virtio

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// TestFSServerHoldsNoOtherMounts: the server's mount namespace, a copy
// of the host's, keeps no mount the server does not need. A FUSE mount
// made elsewhere before the server started (another sandbox's project
// branch) ends when the host unmounts it: its server's loop returns
// while the share's server still runs. Without detachOthers the copy
// holds that mount and its server waits for the share's to end. A mount
// below the shared directory stays visible to the guest.
func TestFSServerHoldsNoOtherMounts(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for mounts")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("needs FUSE: %v", err)
	}
	base := t.TempDir()
	dir, other, src := filepath.Join(base, "project"), filepath.Join(base, "other"), filepath.Join(base, "src")
	for _, d := range []string{filepath.Join(dir, "sub"), other, src} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("tmpfs", filepath.Join(dir, "sub"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(filepath.Join(dir, "sub"), unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(dir, "sub", "below"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	lroot, err := fs.NewLoopbackRoot(src)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := fs.Mount(other, lroot, &fs.Options{MountOptions: fuse.MountOptions{DirectMount: true, Name: "other"}})
	if err != nil {
		t.Fatalf("FUSE mount: %v", err)
	}
	served := make(chan struct{})
	go func() { srv.Wait(); close(served) }()
	defer func() {
		unix.Unmount(other, unix.MNT_DETACH)
		select {
		case <-served:
		case <-time.After(10 * time.Second):
		}
	}()

	d, _ := newFSDriver(t, dir)
	d.init()
	if len(serverPids(t, dir)) != 1 {
		t.Fatalf("server processes %v, want one", serverPids(t, dir))
	}
	e, out := d.call(opLookup, 1, name("sub"), 256)
	if e != 0 {
		t.Fatalf("LOOKUP sub: %d", e)
	}
	sub := binary.LittleEndian.Uint64(out)
	if e, _ := d.call(opLookup, sub, name("below"), 256); e != 0 {
		t.Errorf("LOOKUP sub/below (a mount below the directory): %d", e)
	}
	if err := unix.Unmount(other, 0); err != nil {
		t.Fatalf("unmount %s: %v", other, err)
	}
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatalf("the FUSE mount at %s did not end when the host unmounted it: the share's server holds it", other)
	}
	if len(serverPids(t, dir)) != 1 {
		t.Fatalf("the share's server ended early: %v", serverPids(t, dir))
	}
}
