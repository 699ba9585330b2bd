package cowfs

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A FUSE mount outlives the process that serves it: once that process is
// gone, the mount point answers every access with ENOTCONN (or, served
// over io_uring, ECONNABORTED or ECANCELED: see deadErr) until someone
// unmounts it. So that tine can clean up after a serving process that was
// killed, every mount carries its state root in its source name
// ("tine:BRANCH@TAG", TAG a hash of the root's path), which the kernel
// keeps in mountinfo. Open, which holds the root alone, detaches the
// mounts of its root that no longer answer.

// fuseType is the file system type our mounts show in mountinfo.
const fuseType = "fuse.cowfs"

// rootTag names the state root in the source of its mounts.
func rootTag(root string) string {
	if abs, err := filepath.Abs(root); err == nil {
		root = abs
	}
	if real, err := filepath.EvalSymlinks(root); err == nil {
		root = real
	}
	sum := sha256.Sum256([]byte(root))
	return hex.EncodeToString(sum[:6])
}

// CleanStaleMounts lazily unmounts the mounts made from this state root
// whose server has exited (deadFUSE) and returns their mount
// points. Mounts that answer are left alone. Open calls it.
func (f *FS) CleanStaleMounts() ([]string, error) {
	all, err := readMountinfo()
	if err != nil {
		return nil, fmt.Errorf("clean stale mounts: %w", err)
	}
	var cleaned []string
	var errs []error
	for i, e := range all {
		if e.fsType != fuseType || !strings.HasSuffix(e.source, "@"+f.tag) || !deadFUSE(e.dir) {
			continue
		}
		if covered(all[i+1:], e.dir) {
			errs = append(errs, fmt.Errorf("dead mount %s is covered by another mount: unmount that first, then run: fusermount3 -u %s", e.dir, e.dir))
			continue
		}
		if err := unix.Unmount(e.dir, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("detach dead mount %s (its server has exited): %w; run: fusermount3 -u %s", e.dir, err, e.dir))
			continue
		}
		cleaned = append(cleaned, e.dir)
	}
	return cleaned, errors.Join(errs...)
}

// covered reports whether one of the later mounts is stacked at dir.
func covered(later []mountEntry, dir string) bool {
	for _, e := range later {
		if e.dir == dir {
			return true
		}
	}
	return false
}

// deadFUSE reports whether dir is the root of a FUSE mount whose server is
// gone. It asks statfs, which the kernel never answers from its caches.
func deadFUSE(dir string) bool {
	var st unix.Statfs_t
	return deadErr(unix.Statfs(dir, &st))
}

// deadErr reports whether err is how a FUSE mount answers once its server
// is gone: ENOTCONN; from a connection served over io_uring also
// ECONNABORTED (its rings were torn down) or, until then, ECANCELED (the
// request went to a ring thread that no longer exists). A live server
// never answers either.
func deadErr(err error) bool {
	return errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED) || errors.Is(err, unix.ECANCELED)
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	dir, fsType, source string
	minor               uint32 // of the file system's device: a FUSE mount's connection number
}

// readMountinfo lists this mount namespace's mounts, parents before
// children and lower before stacked ones.
func readMountinfo() ([]mountEntry, error) {
	fh, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("list mounts: %w", err)
	}
	defer fh.Close()
	var out []mountEntry
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if e, ok := parseMountinfo(sc.Text()); ok {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("list mounts: %w", err)
	}
	return out, nil
}

// parseMountinfo decodes one mountinfo line:
// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
func parseMountinfo(line string) (mountEntry, bool) {
	fs := strings.Split(line, " ") // the kernel escapes spaces in paths; other blanks are data
	for i := 6; i+2 < len(fs); i++ {
		if fs[i] == "-" {
			_, min, _ := strings.Cut(fs[2], ":")
			n, _ := strconv.ParseUint(min, 10, 32)
			return mountEntry{dir: unescapeMountinfo(fs[4]),
				fsType: fs[i+1], source: unescapeMountinfo(fs[i+2]), minor: uint32(n)}, true
		}
	}
	return mountEntry{}, false
}

// mountsAt lists the mounts at dir, bottom first.
func mountsAt(dir string) ([]mountEntry, error) {
	all, err := readMountinfo()
	var out []mountEntry
	for _, e := range all {
		if e.dir == dir {
			out = append(out, e)
		}
	}
	return out, err
}

// unescapeMountinfo undoes the octal escapes (\040 and the like) of a
// mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// describeProcess names process pid with its command line, for errors.
func describeProcess(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	cmd := strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' ' // NULs between arguments, and nothing that could forge a line
		}
		return r
	}, string(b)))
	if err != nil || cmd == "" {
		return fmt.Sprintf("process %d", pid)
	}
	if len(cmd) > 200 {
		cmd = cmd[:200] + "..."
	}
	return fmt.Sprintf("process %d (%s)", pid, cmd)
}

// lockHolder describes the process whose pid is written in lock file
// path, or says the holder is unknown.
func lockHolder(path string) string {
	b, _ := os.ReadFile(path)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return "an unknown process"
	}
	return describeProcess(pid)
}
