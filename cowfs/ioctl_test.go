package cowfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// TestNoIoctl: cowfs implements no ioctl, so every IOCTL request (Python
// asks isatty at each open of a file, cp tries FICLONE) is answered
// ENOTTY at once, on the ring's loop (fuseuring.runAsync counts on it:
// an ioctl that did real work would have to run off the loop again).
func TestNoIoctl(t *testing.T) {
	for _, v := range []any{&node{}, &handle{}, &dirHandle{}} {
		_, n := v.(gofs.NodeIoctler)
		_, f := v.(gofs.FileIoctler)
		if n || f {
			t.Errorf("%T implements an ioctl: make FUSE_IOCTL run off the ring's loop (fuseuring.runAsync)", v)
		}
	}
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "ioctl", map[string]string{"a": "A"})
	for _, p := range []string{"a", "new"} {
		file, err := os.OpenFile(filepath.Join(m.Dir(), p), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		_, err = unix.IoctlGetTermios(int(file.Fd()), unix.TCGETS)
		file.Close()
		if !errors.Is(err, unix.ENOTTY) {
			t.Errorf("%s: TCGETS (isatty): %v, want ENOTTY", p, err)
		}
	}
}
