package cowfs

import (
	"errors"
	"fmt"
	"math"
	"syscall"

	"golang.org/x/sys/unix"
)

// The limits of a tree, in one table. encodeDir and decodeDir enforce
// every one through checkEntry, so an object that encodes also decodes;
// the mount refuses the write that would cross one, with the errno given,
// before anything is stored (docs/limits.md).
const (
	maxNameLen       = 255     // bytes of one name (NAME_MAX); ENAMETOOLONG
	maxTargetLen     = 4095    // bytes of a symlink target (PATH_MAX less the NUL); ENAMETOOLONG
	maxXattrNameLen  = 255     // bytes of an xattr name (XATTR_NAME_MAX); ERANGE
	maxXattrValueLen = 1 << 16 // bytes of one xattr value (XATTR_SIZE_MAX); E2BIG
	maxXattrs        = 4096    // xattrs of one entry; ENOSPC
	maxXattrList     = 1 << 16 // names of one entry's xattrs with their NULs (XATTR_LIST_MAX); ENOSPC
	maxXattrBytes    = 1 << 18 // names and values of one entry's xattrs; ENOSPC
	maxLinks         = 65000   // names of one hard-linked file; EMLINK
	maxDirEntries    = 1 << 20 // entries of one directory; ENOSPC
	maxDirBytes      = 1 << 27 // entryCost summed over a directory, bounding its object; ENOSPC
	maxChunkSize     = math.MaxUint32
	maxFileSize      = math.MaxInt64 // bytes of one file; EFBIG
	// maxLeafRefs bounds the chunk refs of one file leaf object, so that a
	// write into a huge file rewrites one leaf, not the whole chunk list.
	maxLeafRefs = 1024
)

// entryOverhead bounds the encoded fixed fields of one directory entry
// with its link (32 bytes); xattrOverhead those of one xattr.
const (
	entryOverhead = 100
	xattrOverhead = 6
)

// xattrCost is what xattrs add to an entry's encoding (an upper bound).
func xattrCost(name string, value []byte) int64 {
	return int64(len(name) + len(value) + xattrOverhead)
}

// entryCost bounds the encoded size of an entry named name with a target
// of tlen bytes and xattrs costing xbytes. It is what a directory's size
// cap counts and what a name costs the quota.
func entryCost(name string, tlen int, xbytes int64) int64 {
	return entryOverhead + int64(len(name)+tlen) + xbytes
}

// errLimit marks a refused write; it wraps the errno the mount returns.
var errLimit = errors.New("limit")

// limitErr reports a write refused by a limit, wrapping errno for the FUSE
// boundary.
func limitErr(errno syscall.Errno, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %w", errLimit, fmt.Sprintf(format, args...), errno)
}

// checkXattrs checks one entry's xattrs against the limits: names sorted
// and distinct, sizes, counts and totals.
func checkXattrs(xs []Xattr) error {
	if len(xs) > maxXattrs {
		return limitErr(syscall.ENOSPC, "%d xattrs, at most %d", len(xs), maxXattrs)
	}
	var list, total int64
	for i, x := range xs {
		switch {
		case x.Name == "" || len(x.Name) > maxXattrNameLen:
			return limitErr(syscall.ERANGE, "xattr name of %d bytes (1 to %d)", len(x.Name), maxXattrNameLen)
		case len(x.Value) > maxXattrValueLen:
			return limitErr(syscall.E2BIG, "xattr %q value of %d bytes, at most %d", x.Name, len(x.Value), maxXattrValueLen)
		case i > 0 && xs[i-1].Name >= x.Name:
			return fmt.Errorf("xattr names out of order or repeated at %q", x.Name)
		}
		list += int64(len(x.Name)) + 1
		total += int64(len(x.Name) + len(x.Value))
	}
	if list > maxXattrList || total > maxXattrBytes {
		return limitErr(syscall.ENOSPC, "xattrs take %d bytes of names and %d in all (at most %d and %d)", list, total, maxXattrList, maxXattrBytes)
	}
	return nil
}

// checkEntry checks the limits of one directory entry that its fields do
// not check by their own encoding.
func checkEntry(e *Entry) error {
	switch {
	case !validName(e.Name):
		return limitErr(syscall.ENAMETOOLONG, "bad name %q (1 to %d bytes, no / or NUL, not . or ..)", e.Name, maxNameLen)
	case len(e.Target) > maxTargetLen:
		return limitErr(syscall.ENAMETOOLONG, "%q: symlink target of %d bytes, at most %d", e.Name, len(e.Target), maxTargetLen)
	case e.Nlink > maxLinks:
		return limitErr(syscall.EMLINK, "%q: %d links, at most %d", e.Name, e.Nlink, maxLinks)
	case e.Size < 0:
		return fmt.Errorf("%q: negative size %d", e.Name, e.Size)
	case e.Type < TypeFile || e.Type > TypeSocket:
		return fmt.Errorf("%q: unknown entry type %d", e.Name, e.Type)
	case !e.ID.IsZero() && e.Type != TypeFile && e.Type != TypeDir:
		return fmt.Errorf("%q: a %s holds no content object", e.Name, e.Type)
	}
	if err := checkXattrs(e.Xattrs); err != nil {
		return fmt.Errorf("%q: %w", e.Name, err)
	}
	return nil
}

// cost is what the entry of in under name counts against its directory's
// size cap and, when the name is made, against the quota.
func (in *inode) cost(name string) int64 {
	return entryCost(name, len(in.target), in.xbytes)
}

// charge counts n bytes against the branch's quota, refusing with ENOSPC
// when they do not fit. Caller holds b.mu.
func (b *branch) charge(n int64) error {
	used := b.meta.UsedBytes
	if q := b.meta.QuotaBytes; q > 0 && n > q-used {
		return limitErr(syscall.ENOSPC, "branch %q: quota of %d bytes has %d used, %d more asked (raise it with SetQuota)", b.name, q, used, n)
	}
	b.meta.UsedBytes = used + min(n, math.MaxInt64-used)
	return nil
}

// roomFor checks that directory d can take entries more entries and bytes
// more entryCost. Caller holds b.mu.
func roomFor(d *inode, entries int, bytes int64) error {
	if len(d.children)+entries > maxDirEntries {
		return limitErr(syscall.ENOSPC, "directory inode %d holds %d entries, at most %d", d.ino, len(d.children), maxDirEntries)
	}
	if d.encBytes+bytes > maxDirBytes {
		return limitErr(syscall.ENOSPC, "directory inode %d would take %d bytes, at most %d", d.ino, d.encBytes+bytes, maxDirBytes)
	}
	return nil
}

// nameErr checks a new name against the limits.
func nameErr(name string) error {
	switch {
	case len(name) > maxNameLen:
		return limitErr(syscall.ENAMETOOLONG, "name of %d bytes, at most %d", len(name), maxNameLen)
	case !validName(name):
		return limitErr(syscall.EINVAL, "bad name %q", name)
	}
	return nil
}

// checkAdd checks that c may be named name in d and charges the name to
// the quota. Caller holds b.mu.
func (b *branch) checkAdd(d *inode, name string, c *inode) error {
	if err := nameErr(name); err != nil {
		return err
	}
	if len(c.target) > maxTargetLen {
		return limitErr(syscall.ENAMETOOLONG, "symlink target of %d bytes, at most %d", len(c.target), maxTargetLen)
	}
	cost := c.cost(name)
	if err := roomFor(d, 1, cost); err != nil {
		return err
	}
	held := nameCost(name)
	if len(c.parents) == 0 { // its first name: the inode is new to the tree
		held += c.inodeCost()
	}
	if err := b.hold(held); err != nil {
		return err
	}
	if err := b.charge(cost); err != nil {
		b.countHeld(-held)
		return err
	}
	return nil
}

// setXattr sets (value non-nil) or removes xattr name of in within the
// limits; a new or larger value is charged to the quota. Caller holds b.mu.
func (b *branch) setXattr(in *inode, name string, value []byte, flags uint32) error {
	old, exists := in.xattrs[name]
	switch {
	case flags&unix.XATTR_CREATE != 0 && exists:
		return limitErr(syscall.EEXIST, "xattr %q exists", name)
	case (flags&unix.XATTR_REPLACE != 0 || value == nil) && !exists:
		return limitErr(syscall.ENODATA, "no xattr %q", name)
	case len(name) > maxXattrNameLen || name == "":
		return limitErr(syscall.ERANGE, "xattr name of %d bytes (1 to %d)", len(name), maxXattrNameLen)
	case len(value) > maxXattrValueLen:
		return limitErr(syscall.E2BIG, "xattr value of %d bytes, at most %d", len(value), maxXattrValueLen)
	}
	var delta int64
	if exists {
		delta -= xattrCost(name, old)
	}
	if value != nil {
		delta += xattrCost(name, value)
		count, list, total := 1, int64(len(name)+1), int64(len(name)+len(value))
		for k, v := range in.xattrs {
			if k != name {
				count++
				list += int64(len(k)) + 1
				total += int64(len(k) + len(v))
			}
		}
		if count > maxXattrs || list > maxXattrList || total > maxXattrBytes {
			return limitErr(syscall.ENOSPC, "inode %d: %d xattrs taking %d bytes of names and %d in all (at most %d, %d and %d)",
				in.ino, count, list, total, maxXattrs, maxXattrList, maxXattrBytes)
		}
		for p, k := range in.parents {
			if err := roomFor(p, 0, delta*int64(k)); err != nil {
				return err
			}
		}
		if err := b.hold(delta); err != nil {
			return err
		}
		if err := b.charge(max(delta, 0)); err != nil {
			b.countHeld(-delta)
			return err
		}
		if in.xattrs == nil {
			in.xattrs = map[string][]byte{}
		}
		in.xattrs[name] = append([]byte{}, value...)
	} else {
		delete(in.xattrs, name)
		b.countHeld(delta)
	}
	in.xbytes += delta
	for p, k := range in.parents {
		p.encBytes += delta * int64(k)
	}
	in.ctime = nowNs()
	return b.touch(in)
}
