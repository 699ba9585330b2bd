package sandbox

import "tine/cowfs"

// projectMountOptions are the options of a sandbox's project mount. A
// sandbox in a user namespace (sandbox/ns) reaches it as an unprivileged
// host uid: FUSE lets it in only with allow_other. Other host users still
// cannot: the mounts lie under the state root, which only root may enter.
func projectMountOptions() *cowfs.MountOptions {
	return &cowfs.MountOptions{AllowOther: true}
}
