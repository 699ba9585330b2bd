package cowfs

import "tine/cowfs/internal/fuseuring"

// URingOffered reports whether the kernel offers FUSE over io_uring to
// new mounts (Linux 6.14+ with the fuse module's enable_uring set). A
// mount then serves its requests on per-CPU rings unless
// MountOptions.NoURing is set (ADR 0181).
func URingOffered() bool { return fuseuring.Enabled() }

// OfferURing turns the kernel's offer of FUSE over io_uring on or off
// for new mounts of every FUSE server of the host (it writes the fuse
// module's enable_uring parameter; root only). Servers that do not ask
// for io_uring are not affected.
func OfferURing(on bool) error {
	_, err := fuseuring.SetEnabled(on)
	return err
}
