// Package filecopy copies a file's bytes on the host without ever
// writing more than the file holds: a sandbox can make a file of a
// terabyte that takes no block (truncate, a seek past the end), and a
// copy that wrote its holes out as zeros would fill the host's disk.
package filecopy

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Copy gives dst, an empty file open for writing, src's bytes: a
// reflink where the file system shares extents; else the whole file when
// its blocks cover its size (no room for a hole), and src's data ranges
// alone otherwise (found with SEEK_DATA and SEEK_HOLE), its holes left
// holes, then src's size; copied in the kernel where it can. A file system that
// cannot tell holes has its whole file copied. src may change while it
// is copied (a running sandbox's file): Copy then stops at the end it
// finds and gives dst the size src had at the start; the caller tells
// whether the copy is good (its stamp).
func Copy(dst, src *os.File) error {
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	if unix.IoctlFileClone(dfd, sfd) == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return err
	}
	size := st.Size
	if st.Blocks*512 >= size {
		// No room for a hole: one copy of the whole, the common case,
		// without seeking for data.
		n, err := copyRange(dfd, sfd, 0, size)
		if err != nil || n == size {
			return err
		}
		return unix.Ftruncate(dfd, size) // src shrank
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // a hole to the end
		}
		end := size
		if err != nil {
			data = off // holes unknown here: copy the rest
		} else if hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE); err == nil {
			end = min(hole, size)
		}
		if data >= end {
			break
		}
		n, err := copyRange(dfd, sfd, data, end-data)
		if err != nil {
			return err
		}
		if n < end-data {
			break // src shrank
		}
		off = end
	}
	return unix.Ftruncate(dfd, size)
}

// copyRange copies n bytes at off from sfd to dfd at the same offset,
// and returns how many it copied (fewer where src ends first).
func copyRange(dfd, sfd int, off, n int64) (int64, error) {
	done := int64(0)
	for done < n {
		in, out := off+done, off+done
		c, err := unix.CopyFileRange(sfd, &in, dfd, &out, int(min(n-done, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				m, err := copyBuffered(dfd, sfd, off+done, n-done)
				return done + m, err
			}
			return done, err
		}
		if c == 0 {
			break
		}
		done += int64(c)
	}
	return done, nil
}

// copyBuffered is copyRange through a buffer, for file systems that
// copy_file_range refuses.
func copyBuffered(dfd, sfd int, off, n int64) (int64, error) {
	buf := make([]byte, min(n, 1<<20))
	done := int64(0)
	for done < n {
		r, err := unix.Pread(sfd, buf[:min(int64(len(buf)), n-done)], off+done)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return done, err
		}
		if r == 0 {
			break
		}
		for w := 0; w < r; {
			c, err := unix.Pwrite(dfd, buf[w:r], off+done+int64(w))
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return done, err
			}
			w += c
		}
		done += int64(r)
	}
	return done, nil
}
