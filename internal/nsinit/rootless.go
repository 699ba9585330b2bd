package nsinit

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	rootlessOnce sync.Once
	rootlessOn   bool
)

// Rootless reports whether this process runs in a user namespace other
// than the host's, as rootless mode does: sandboxes then share it.
func Rootless() bool {
	rootlessOnce.Do(func() {
		b, err := os.ReadFile("/proc/self/uid_map")
		if err != nil {
			return
		}
		f := strings.Fields(string(b))
		rootlessOn = !(len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295")
	})
	return rootlessOn
}

// rootlessSkip are the top-level directories a rootless root does not
// take from the host: the init step mounts its own.
var rootlessSkip = map[string]bool{"proc": true, "sys": true, "dev": true, "tmp": true, "run": true}

// mountRootless builds a rootless sandbox's root at c.Root: a tmpfs with
// the host root's top-level symlinks, and over each top-level directory
// an overlay of the host's with the sandbox's layer (upper/NAME, its
// scratch directory work/NAME), in overlayfs's user.* attributes. A
// directory that cannot be overlaid (mounts below it) is bound read-only.
func mountRootless(c *Config) (int, error) {
	if err := unix.Mount("tmpfs", c.Root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755"); err != nil {
		return -1, fmt.Errorf("rootless root at %s: %w", c.Root, err)
	}
	ents, err := os.ReadDir("/")
	if err != nil {
		return -1, fmt.Errorf("rootless root: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		dst := filepath.Join(c.Root, name)
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink("/" + name)
			if err == nil {
				err = os.Symlink(t, dst)
			}
			if err != nil {
				return -1, fmt.Errorf("rootless root: /%s: %w", name, err)
			}
		case e.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return -1, fmt.Errorf("rootless root: %w", err)
			}
			if rootlessSkip[name] {
				continue
			}
			if err := overlayDir(c, name, dst); err != nil {
				if err := bindReadOnly("/"+name, dst); err != nil {
					return -1, err
				}
			}
		}
	}
	fd, err := unix.Open(c.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", c.Root, err)
	}
	return fd, nil
}

// overlayDir mounts at dst the overlay of the host's /name under the
// sandbox's layer for it.
func overlayDir(c *Config, name, dst string) error {
	if strings.ContainsAny(name, ",:\\\n") {
		return fmt.Errorf("%q: not an overlay option", name)
	}
	up, wk := filepath.Join(c.Upper, name), filepath.Join(c.Work, name)
	if err := os.MkdirAll(up, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(wk, 0o700); err != nil {
		return err
	}
	opts := "userxattr,lowerdir=/" + name + ",upperdir=" + up + ",workdir=" + wk
	if err := unix.Mount("overlay", dst, "overlay", 0, opts); err != nil {
		os.Remove(up) // empty unless the layer had files there
		return fmt.Errorf("overlay /%s: %w", name, err)
	}
	return nil
}

// bindReadOnly binds src (and the mounts below it) read-only at dst.
func bindReadOnly(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("rootless root: bind %s: %w", src, err)
	}
	var st unix.Statfs_t
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	if unix.Statfs(dst, &st) == nil {
		// Flags the host set are locked in a user namespace: keep them.
		flags |= uintptr(st.Flags) & (unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME)
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("rootless root: make %s read-only: %w", src, err)
	}
	return nil
}
