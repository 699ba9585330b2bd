package vm

import "tine/sandbox"

// Features implements sandbox.Featurer: a vm sandbox has none of the
// Manager's host-side parts built for the ns runtime (the network
// gateway and filter, forwarded ports, cgroup limits and usage); the
// Manager refuses them for it. Its size is its guest size (GuestSize).
func (r *Runtime) Features() sandbox.Features { return sandbox.Features{} }
