package oci

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// maxIDFile bounds /etc/passwd and /etc/group read from an image.
const maxIDFile = 4 << 20

// ResolveUser turns an image's USER (NAME, UID, NAME:GROUP or UID:GID;
// "" is root) into ids, looking names up in the image's own /etc/passwd
// and /etc/group under rootfs (resolved inside rootfs: a symlink there
// never reaches the host's). A user without a group takes the primary
// group /etc/passwd gives it, or its uid's number without an entry.
func ResolveUser(rootfs, user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	uid, pgid, found, err := lookup(rootfs, "etc/passwd", u, 2, 3)
	if err != nil {
		return 0, 0, fmt.Errorf("image user %q: %w", user, err)
	}
	if !found {
		return 0, 0, fmt.Errorf("image user %q: no user %q in the image's /etc/passwd", user, u)
	}
	gid = pgid
	if hasGroup {
		var gfound bool
		if gid, _, gfound, err = lookup(rootfs, "etc/group", g, 2, -1); err != nil {
			return 0, 0, fmt.Errorf("image user %q: %w", user, err)
		}
		if !gfound {
			return 0, 0, fmt.Errorf("image user %q: no group %q in the image's /etc/group", user, g)
		}
	}
	return uid, gid, nil
}

// lookup finds key (a name, or a number, which needs no entry) in the
// colon-separated file rel under rootfs: field idField is its id, field
// gidField (if >= 0) a second id.
func lookup(rootfs, rel, key string, idField, gidField int) (id, id2 uint32, found bool, err error) {
	if n, err := strconv.ParseUint(key, 10, 32); err == nil {
		id, id2, found = uint32(n), uint32(n), true
	}
	b, err := readInRoot(rootfs, rel)
	if err != nil {
		if found {
			return id, id2, true, nil // a number needs no entry
		}
		return 0, 0, false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) <= max(idField, gidField) {
			continue
		}
		if f[0] != key && f[idField] != key {
			continue
		}
		n, err := strconv.ParseUint(f[idField], 10, 32)
		if err != nil {
			continue
		}
		id, id2 = uint32(n), uint32(n)
		if gidField >= 0 {
			m, err := strconv.ParseUint(f[gidField], 10, 32)
			if err != nil {
				continue
			}
			id2 = uint32(m)
		}
		return id, id2, true, nil
	}
	return id, id2, found, nil
}

// readInRoot reads the regular file rel under rootfs, resolving it as if
// rootfs were /, bounded by maxIDFile.
func readInRoot(rootfs, rel string) ([]byte, error) {
	rfd, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return nil, fmt.Errorf("/%s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("/%s is not a regular file", rel)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxIDFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxIDFile {
		return nil, fmt.Errorf("/%s: more than %d bytes", rel, maxIDFile)
	}
	return b, nil
}
