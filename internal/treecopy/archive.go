package treecopy

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Archive writes the file, symlink or directory tree named name in the
// directory open as parentFD to w as a tar stream (PAX format). Entries
// are named name, name/child, name/child/grand…, children in sorted
// order; a symlink is archived as a symlink, never followed, and a file
// with several links as a regular file each time. The top must be a
// file, directory or symlink; fifos, sockets and devices below it are
// left out and counted in Stats.Skipped, and an entry that vanishes while
// the tree is walked is left out too. Modes keep their setuid, setgid and
// sticky bits; owners are not recorded. A file that shrinks while it is
// read fails the call; one that grows is cut at the size it had. Archive
// does not close w, writes nothing to it after an error (the caller cuts
// the stream), and ends the stream with tar's end marker on success.
func Archive(ctx context.Context, w io.Writer, parentFD int, name string) (Stats, error) {
	var st Stats
	if err := checkName(name); err != nil {
		return st, fmt.Errorf("archive: %w", err)
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	a := &archiver{ctx: ctx, tw: tar.NewWriter(bw), st: &st, buf: make([]byte, 256<<10)}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	var s unix.Stat_t
	if err := unix.Fstatat(parentFD, name, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, fmt.Errorf("archive %q: %w", name, err)
	}
	var err error
	switch s.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		err = a.tree(parentFD, name)
	case unix.S_IFREG:
		err = a.file(parentFD, name, name, true)
	case unix.S_IFLNK:
		err = a.symlink(parentFD, name, name, &s, true)
	default:
		return st, fmt.Errorf("archive %q: it is a %s; only a file, directory or symlink can be copied", name, kindOf(s.Mode))
	}
	if err != nil {
		return st, err
	}
	if err := a.tw.Close(); err != nil {
		return st, fmt.Errorf("archive %q: write: %w", name, err)
	}
	st.Name = name
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("archive %q: write: %w", name, err)
	}
	return st, nil
}

type archiver struct {
	ctx    context.Context
	tw     *tar.Writer
	st     *Stats
	buf    []byte // content read buffer
	dirBuf []byte // directory read buffer
}

// dirFrame is a directory being archived, the current one or one above
// it on the way down.
type dirFrame struct {
	path     string   // its entry name, without the trailing slash
	names    []string // its entries still to archive, sorted
	dev, ino uint64   // its identity, to check the climb back
}

// tree archives the directory name in parentFD and all it holds. It
// keeps one directory open at a time: the current one. It climbs back
// with "..", checking that it comes back to the directory it left.
func (a *archiver) tree(parentFD int, name string) error {
	fd, err := openDir(parentFD, name)
	if err != nil {
		return fmt.Errorf("archive %q: %w", name, err)
	}
	f, err := a.enter(fd, name)
	if err != nil {
		unix.Close(fd)
		return err
	}
	stack := []dirFrame{f}
	for len(stack) > 0 {
		if err := a.ctx.Err(); err != nil {
			unix.Close(fd)
			return err
		}
		top := &stack[len(stack)-1]
		if len(top.names) == 0 {
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				break
			}
			up := stack[len(stack)-1]
			pfd, err := unix.Openat(fd, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("archive %q: %w", up.path, err)
			}
			fd = pfd
			if !sameFile(fd, up.dev, up.ino) {
				unix.Close(fd)
				return fmt.Errorf("archive %q: it was moved while it was read; copy it again when it is still", top.path)
			}
			continue
		}
		child := top.names[0]
		top.names = top.names[1:]
		p := top.path + "/" + child
		var s unix.Stat_t
		if err := unix.Fstatat(fd, child, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // gone since the listing
			}
			unix.Close(fd)
			return fmt.Errorf("archive %q: %w", p, err)
		}
		switch s.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			cfd, err := openDir(fd, child)
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				unix.Close(fd)
				return fmt.Errorf("archive %q: %w", p, err)
			}
			f, err := a.enter(cfd, p)
			unix.Close(fd)
			fd = cfd
			if err != nil {
				unix.Close(fd)
				return err
			}
			stack = append(stack, f)
		case unix.S_IFREG:
			err = a.file(fd, child, p, false)
		case unix.S_IFLNK:
			err = a.symlink(fd, child, p, &s, false)
		case unix.S_IFIFO, unix.S_IFCHR, unix.S_IFBLK:
			// A header alone, so that the other side knows what it was
			// not given: Extract skips and counts it.
			a.st.Skipped++
			err = a.header(&tar.Header{Typeflag: specialType(s.Mode), Name: p,
				Devmajor: int64(unix.Major(s.Rdev)), Devminor: int64(unix.Minor(s.Rdev))}, &s)
		default:
			a.st.Skipped++ // a socket has no tar type
		}
		if err != nil {
			unix.Close(fd)
			return err
		}
	}
	unix.Close(fd)
	return nil
}

// enter writes the header of the directory open as fd, whose entry name
// is p, and lists it.
func (a *archiver) enter(fd int, p string) (dirFrame, error) {
	var s unix.Stat_t
	if err := unix.Fstat(fd, &s); err != nil {
		return dirFrame{}, fmt.Errorf("archive %q: %w", p, err)
	}
	if err := a.header(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/"}, &s); err != nil {
		return dirFrame{}, err
	}
	if a.dirBuf == nil {
		a.dirBuf = make([]byte, 32<<10)
	}
	names, err := readNames(fd, a.dirBuf)
	if err != nil {
		return dirFrame{}, fmt.Errorf("archive %q: list: %w", p, err)
	}
	slices.Sort(names)
	a.st.Dirs++
	return dirFrame{path: p, names: names, dev: uint64(s.Dev), ino: uint64(s.Ino)}, nil
}

// file archives the regular file name in dirfd as the entry p. top says
// it is the top of the archive, which may not vanish.
func (a *archiver) file(dirfd int, name, p string, top bool) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) && !top {
		return nil // gone since the listing
	}
	if errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("archive %q: it changed while it was read (now a symlink); copy it again when it is still", p)
	}
	if err != nil {
		return fmt.Errorf("archive %q: %w", p, err)
	}
	defer unix.Close(fd)
	var s unix.Stat_t
	if err := unix.Fstat(fd, &s); err != nil {
		return fmt.Errorf("archive %q: %w", p, err)
	}
	if s.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("archive %q: it changed while it was read (now a %s); copy it again when it is still", p, kindOf(s.Mode))
	}
	if err := a.header(&tar.Header{Typeflag: tar.TypeReg, Name: p, Size: s.Size}, &s); err != nil {
		return err
	}
	for done := int64(0); done < s.Size; {
		if err := a.ctx.Err(); err != nil {
			return err
		}
		b := a.buf[:min(int64(len(a.buf)), s.Size-done)]
		n, err := unix.Read(fd, b)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return fmt.Errorf("archive %q: read: %w", p, err)
		}
		if n == 0 {
			return fmt.Errorf("archive %q: it changed while it was read: it ended after %d of %d bytes; copy it again when it is still", p, done, s.Size)
		}
		if _, err := a.tw.Write(b[:n]); err != nil {
			return fmt.Errorf("archive %q: write: %w", p, err)
		}
		done += int64(n)
	}
	a.st.Files++
	a.st.Bytes += s.Size
	return nil
}

// symlink archives the symlink name in dirfd, whose lstat is s, as the
// entry p.
func (a *archiver) symlink(dirfd int, name, p string, s *unix.Stat_t, top bool) error {
	buf := make([]byte, 4096)
	for {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if errors.Is(err, unix.ENOENT) && !top {
			return nil // gone since the listing
		}
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("archive %q: it changed while it was read (no longer a symlink); copy it again when it is still", p)
		}
		if err != nil {
			return fmt.Errorf("archive %q: %w", p, err)
		}
		if n < len(buf) {
			if err := a.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: string(buf[:n])}, s); err != nil {
				return err
			}
			a.st.Symlinks++
			return nil
		}
		if len(buf) >= 1<<20 {
			return fmt.Errorf("archive %q: symlink target longer than %d bytes", p, len(buf))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// specialType is the tar type of a fifo or device mode.
func specialType(mode uint32) byte {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return tar.TypeFifo
	case unix.S_IFCHR:
		return tar.TypeChar
	}
	return tar.TypeBlock
}

// header completes h with the mode and time in s and writes it.
func (a *archiver) header(h *tar.Header, s *unix.Stat_t) error {
	if err := a.ctx.Err(); err != nil {
		return err
	}
	h.Mode = int64(s.Mode & 0o7777)
	h.ModTime = time.Unix(s.Mtim.Unix())
	h.Format = tar.FormatPAX
	if err := a.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("archive %q: write: %w", h.Name, err)
	}
	return nil
}

// kindOf names the file type in mode.
func kindOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	}
	return "file of unknown type"
}
