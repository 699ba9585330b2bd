package guestagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMountShareRemounts runs the share mount with tmpfs standing in for
// virtio-fs (which needs the VM's device): the path is made and mounted,
// a second call replaces the mount (a new, empty file system), and a
// mount in use is refused naming the path, left as it was.
func TestMountShareRemounts(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounts need root")
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
	if _, err := os.Stat(filepath.Join(dir, "old")); !os.IsNotExist(err) {
		t.Fatalf("the old mount is still there: %v", err)
	}
	f, err := os.Create(filepath.Join(dir, "held"))
	if err != nil {
		t.Fatal(err)
	}
	err = mountShare("none", dir, "tmpfs")
	if err == nil || !strings.Contains(err.Error(), "busy") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("remount of a busy share: %v", err)
	}
	f.Close()
	if _, err := os.Stat(filepath.Join(dir, "held")); err != nil {
		t.Fatalf("the busy mount was not left as it was: %v", err)
	}
}
