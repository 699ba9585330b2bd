package cowfs

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The kernel opens a passthrough file's backing file again for every open
// of the FUSE file, with that open's flags and the FUSE server's
// credentials, skipping permission checks; only the mount's read-only flag
// still applies. Cache files handed to the kernel are therefore opened
// through a private read-only mount of the cache directory (a detached
// clone: nothing is mounted anywhere), so that no open, whatever cowfs
// answers, can reach a shared cache file for writing (ADR 0052).

// cacheView returns the read-only view of the cache directory, making it
// at the first call.
func (f *FS) cacheView() (*os.File, error) {
	f.viewMu.Lock()
	defer f.viewMu.Unlock()
	if f.view != nil || f.viewErr != nil {
		return f.view, f.viewErr
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, f.cacheDir(), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err == nil {
		err = unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY})
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		f.viewErr = fmt.Errorf("read-only view of the cache %s (passthrough needs CAP_SYS_ADMIN): %w", f.cacheDir(), err)
		return nil, f.viewErr
	}
	f.view = os.NewFile(uintptr(fd), f.cacheDir()+" (read-only view)")
	return f.view, nil
}

// openView opens cache file name read-only through the read-only view.
func (f *FS) openView(name string) (*os.File, error) {
	view, err := f.cacheView()
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat(int(view.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// closeView drops the read-only view; files opened through it keep it
// until they are closed.
func (f *FS) closeView() {
	f.viewMu.Lock()
	defer f.viewMu.Unlock()
	if f.view != nil {
		f.view.Close()
		f.view = nil
	}
}
