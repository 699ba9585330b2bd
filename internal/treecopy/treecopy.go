// Package treecopy moves a file, symlink or directory tree as a tar
// stream, the way tine cp copies between the host and a sandbox: Archive
// writes the stream from one side, Extract places it on the other.
//
// Extract takes every archive as hostile (one that comes out of a
// sandbox is extracted on the host): it writes nothing outside its
// target, follows no symlink, makes no device, fifo or hard link, drops
// setuid and setgid bits unless asked to keep them, never changes an
// owner, writes runs of zeros as holes, and bounds the memory it uses
// whatever the stream holds. A new target appears whole or not at all.
//
// Both walk the tree with file descriptors, never with path strings, and
// keep a bounded number of them open however deep the tree. Neither
// syncs what it writes: the caller decides on durability (syncfs or
// fsync after Extract).
package treecopy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Stats says what an Archive or Extract call moved.
type Stats struct {
	// Name is the top entry's name: as archived, or as placed in its
	// directory by Extract.
	Name     string `json:"name,omitempty"`
	Files    int    `json:"files"`
	Dirs     int    `json:"dirs"`
	Symlinks int    `json:"symlinks"`
	// Skipped counts fifos, sockets, devices, hard links and unknown
	// types, which are left out (Archive writes a header alone for a fifo
	// or device, so that Extract counts it too).
	Skipped int   `json:"skipped"`
	Bytes   int64 `json:"bytes"` // regular files' content
}

// tempPrefix starts the names of what Extract makes before it renames
// it into place.
const tempPrefix = ".tine-cp-"

// checkName refuses a name that is not one path component.
func checkName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return fmt.Errorf("%q is not a file name; give the name of an entry in the directory", name)
	case strings.IndexByte(name, '/') >= 0:
		return fmt.Errorf("%q is not a single file name; open its directory and give the last component", name)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%q holds a NUL byte; no file can have that name", name)
	}
	return nil
}

// tempName returns a fresh name for something made before it is renamed
// into place.
func tempName() string {
	var b [8]byte
	rand.Read(b[:])
	return tempPrefix + hex.EncodeToString(b[:])
}

// readNames lists the directory open as fd (read from its start),
// reading through buf.
func readNames(fd int, buf []byte) ([]string, error) {
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// openDir opens the directory name in dirfd for reading, not following a
// symlink.
func openDir(dirfd int, name string) (int, error) {
	return unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// sameFile says whether fd is the file with the identity dev and ino.
func sameFile(fd int, dev, ino uint64) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && uint64(st.Dev) == dev && uint64(st.Ino) == ino
}

// identity returns the device and inode of the open file fd.
func identity(fd int) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, err
	}
	return uint64(st.Dev), uint64(st.Ino), nil
}

// removeAll removes name in dirfd and, if it is a directory, all it
// holds. It follows no symlink and keeps two descriptors open however
// deep the tree: it climbs back with "..", checking it comes back to the
// directory it left. It is for trees Extract made: it makes each
// directory it empties writable first.
func removeAll(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	fd, err := openForRemove(dirfd, name)
	if err != nil {
		return err
	}
	// frame is a directory being emptied, above the current one.
	type frame struct {
		dev, ino uint64   // its identity, to check the climb back
		child    string   // the name of the directory below it
		rest     []string // its entries still to remove
	}
	var stack []frame
	var rest []string
	buf := make([]byte, 32<<10)
	listed := false
	for {
		if !listed {
			if rest, err = readNames(fd, buf); err != nil {
				unix.Close(fd)
				return err
			}
			listed = true
		}
		descend := ""
		for len(rest) > 0 && descend == "" {
			n := rest[0]
			rest = rest[1:]
			err := unix.Unlinkat(fd, n, 0)
			if errors.Is(err, unix.EISDIR) {
				err = unix.Unlinkat(fd, n, unix.AT_REMOVEDIR)
				if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
					descend, err = n, nil
				}
			}
			if err != nil && !errors.Is(err, unix.ENOENT) {
				unix.Close(fd)
				return err
			}
		}
		if descend != "" {
			dev, ino, err := identity(fd)
			if err != nil {
				unix.Close(fd)
				return err
			}
			cfd, err := openForRemove(fd, descend)
			unix.Close(fd)
			if err != nil {
				return err
			}
			stack = append(stack, frame{dev, ino, descend, rest})
			fd, rest, listed = cfd, nil, false
			continue
		}
		if len(stack) == 0 {
			unix.Close(fd)
			return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		}
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		pfd, err := unix.Openat(fd, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return err
		}
		if !sameFile(pfd, f.dev, f.ino) {
			unix.Close(pfd)
			return fmt.Errorf("%q was moved while it was being removed", f.child)
		}
		if err := unix.Unlinkat(pfd, f.child, unix.AT_REMOVEDIR); err != nil {
			unix.Close(pfd)
			return err
		}
		fd, rest = pfd, f.rest
	}
}

// openForRemove opens the directory name in dirfd and makes it readable
// and writable by its owner, so that what it holds can be removed.
func openForRemove(dirfd int, name string) (int, error) {
	fd, err := openDir(dirfd, name)
	if errors.Is(err, unix.EACCES) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			unix.Fchmodat(dirfd, name, 0o700, 0)
			fd, err = openDir(dirfd, name)
		}
	}
	if err != nil {
		return -1, err
	}
	unix.Fchmod(fd, 0o700)
	return fd, nil
}
