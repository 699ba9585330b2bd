package cowfs

import (
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// DefaultCacheTimeout is how long the kernel keeps a mount's names,
// attributes and negative lookups when MountOptions.Timeout is zero.
// Every change to a branch goes through its own mount, so the kernel's
// view stays right without expiry; where the server changes a tree
// behind the kernel (a rollback of a mounted branch, a pooled mount bound
// to a branch) it invalidates the kernel's entries itself (ADR 0160).
const DefaultCacheTimeout = time.Hour

// MountOptions tunes Mount.
type MountOptions struct {
	// Timeout is the kernel's entry, attribute and negative-lookup cache
	// time. Zero means DefaultCacheTimeout; a negative value disables
	// caching.
	Timeout time.Duration
	// NoPassthrough turns off FUSE passthrough for reads of unchanged files.
	NoPassthrough bool
	// NoKeepCache makes every open of a file and of a directory start
	// with an empty kernel page cache and directory cache, as before
	// ADR 0160; it exists to measure that choice.
	NoKeepCache bool
	// Writeback turns on the kernel's writeback cache
	// (FUSE_WRITEBACK_CACHE): writes are gathered in the page cache and
	// sent in large pieces. The kernel then turns passthrough off, so
	// it is off by default (ADR 0161).
	Writeback bool
	// NoURing serves the mount over /dev/fuse even where the kernel
	// offers FUSE over io_uring (ADR 0181); it exists to measure that
	// choice.
	NoURing bool
	// Debug logs every FUSE request.
	Debug bool
	// AllowOther lets users other than the mounting one into the mount
	// (FUSE's allow_other; needs root or user_allow_other in
	// /etc/fuse.conf). Without it the kernel refuses every other user,
	// root included. Set it only when the sandbox's processes run as
	// another uid, and keep the mount's parent directory closed to the
	// users who must not enter.
	AllowOther bool
}

// fuseOptions are the go-fuse options of every mount.
func fuseOptions(fsName string, opts *MountOptions) *gofs.Options {
	to := opts.Timeout
	if to == 0 {
		to = DefaultCacheTimeout
	}
	if to < 0 {
		to = 0
	}
	caps := uint64(fuse.CAP_READDIRPLUS_AUTO) | fuse.CAP_HANDLE_KILLPRIV_V2
	if opts.Writeback {
		caps |= fuse.CAP_WRITEBACK_CACHE
	}
	return &gofs.Options{
		EntryTimeout:    &to,
		AttrTimeout:     &to,
		NegativeTimeout: &to,
		RootStableAttr:  &gofs.StableAttr{Ino: 1},
		// Mode 000 is a mode like any other: without this go-fuse shows
		// a file with no permission bits as 0644 and a directory as 0755,
		// and the kernel's permission checks follow what it shows.
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			FsName:      fsName,
			Name:        "cowfs",
			AllowOther:  opts.AllowOther,
			Options:     []string{"default_permissions"},
			DirectMount: true,
			// Sandboxes in a user namespace see the mount idmapped (sandbox/ns).
			IDMappedMount: true,
			MaxWrite:      1 << 20,
			Debug:         opts.Debug,
			// Attributes with directory listings only when the caller goes
			// on to stat the entries (the kernel's adaptive mode).
			ExtraCapabilities: caps,
			// A symlink's target never changes for an inode number.
			EnableSymlinkCaching: true,
			// The server drops what it changes behind the kernel (ADR
			// 0160); the kernel's own guess, from a new mtime, dropped the
			// pages of every file just written (ADR 0211).
			ExplicitDataCacheControl: true,
		},
	}
}
