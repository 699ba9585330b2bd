package guestagent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// TestMountShare runs the share mount with tmpfs standing in for
// virtio-fs (which needs the VM's device): the path is made and mounted,
// and a second call keeps a mount that answers, with its files. A mount
// that no longer answers (a FUSE mount whose connection was aborted,
// standing in for a clone's share without its parent's session) is
// replaced, and refused naming the path while a process holds it.
func TestMountShare(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("mounts need root")
	}
	dir := filepath.Join(t.TempDir(), "deep", "proj with space")
	t.Cleanup(func() {
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	if err := mountShare("none", dir, "tmpfs"); err != nil {
		t.Fatal(err)
	}
	if ok, err := isMountPoint(dir); !ok || err != nil {
		t.Fatalf("not mounted: %v %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "old"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := mountShare("none", dir, "tmpfs"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "old")); err != nil {
		t.Fatalf("a mount that answers was replaced: %v", err)
	}
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}

	// A dead mount, held by an open directory.
	srv, err := fs.Mount(dir, &fs.Inode{}, &fs.Options{MountOptions: fuse.MountOptions{DirectMount: true}})
	if err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	// The FUSE control file system, where connections are aborted, is
	// not always mounted.
	ctl := "/sys/fs/fuse/connections"
	if ok, _ := isMountPoint(ctl); !ok {
		if err := unix.Mount("none", ctl, "fusectl", 0, ""); err != nil {
			t.Fatalf("mount the FUSE control file system: %v", err)
		}
	}
	abort := fmt.Sprintf("%s/%d/abort", ctl, unix.Minor(st.Dev))
	if err := os.WriteFile(abort, []byte("1"), 0o200); err != nil {
		t.Fatal(err)
	}
	defer srv.Unmount()
	err = mountShare("none", dir, "tmpfs")
	if err == nil || !strings.Contains(err.Error(), "busy") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("remount of a busy dead share: %v", err)
	}
	held.Close()
	if err := mountShare("none", dir, "tmpfs"); err != nil {
		t.Fatal(err)
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(dir, &sf); err != nil || sf.Type != unix.TMPFS_MAGIC {
		t.Fatalf("the dead share was not replaced: %v, type %#x", err, sf.Type)
	}
}
