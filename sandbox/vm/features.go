package vm

import "tine/sandbox"

// Features implements sandbox.Featurer: a vm sandbox has the inside
// API's socket at /run/tine/api.sock (over vsock, insideapi.go) but none
// of the Manager's other host-side parts built for the ns runtime (the
// network gateway and policy filter, forwarded ports, cgroup limits and
// usage); the Manager refuses them for it. Its size is its guest size
// (GuestSize). Its machine's own link to the host (a TAP and a /30 per
// start, net.go) is the runtime's.
func (r *Runtime) Features() sandbox.Features { return sandbox.Features{APISocket: true} }
