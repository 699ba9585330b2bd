package cowfs

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFUSEDeviceNotInherited: after a mount, a program this process
// executes holds no descriptor of /dev/fuse.
func TestFUSEDeviceNotInherited(t *testing.T) {
	f := openTestFS(t)
	mountNew(t, f, "main", map[string]string{"a": "x"})
	out, err := exec.Command("sh", "-c", "for f in /proc/$$/fd/*; do readlink $f; done; true").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if strings.Contains(string(out), "/dev/fuse") {
		t.Errorf("a child holds the FUSE device:\n%s", out)
	}
}

// TestMountFilesNotInherited: a program that another goroutine starts
// while mounts are being made holds no descriptor of a file on one of
// them. go-fuse opens one file of each new mount without O_CLOEXEC (its
// poll hack); a long-lived child that inherited it kept the mount busy,
// and the unmount of that mount then waited forever.
func TestMountFilesNotInherited(t *testing.T) {
	f := openTestFS(t)
	pool, err := f.NewMountPool(context.Background(), filepath.Join(t.TempDir(), "pool"), 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	done := make(chan struct{})
	leaked := make(chan string, 1)
	go func() {
		defer close(leaked)
		for {
			select {
			case <-done:
				return
			default:
			}
			out, _ := exec.Command("sh", "-c", "for f in /proc/$$/fd/*; do readlink $f; done; true").CombinedOutput()
			if strings.Contains(string(out), pool.Dir()) {
				leaked <- string(out)
				return
			}
		}
	}()
	for range 60 {
		pm, err := pool.newPlaceholder()
		if err != nil {
			t.Fatal(err)
		}
		if err := pool.discard(pm); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	if out, ok := <-leaked; ok {
		t.Fatalf("a child holds a descriptor on a mount:\n%s", out)
	}
}
