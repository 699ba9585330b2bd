package vm

import (
	"net"
	"time"

	"tine/guestagent/proto"
	"tine/vmm/virtio"
)

// exposeInsideAPI lets the guest reach the sandbox's inside API: the
// machine's vsock device takes the guest's connections to host port
// proto.InsideAPIPort (the guest agent forwards /run/tine/api.sock
// there) and bridges each to a new connection to the host socket at
// path (sandbox.Spec.APISocket). Every machine, a clone too, has its own
// device and so reaches only its own sandbox's socket.
func exposeInsideAPI(v *virtio.Vsock, path string) {
	if path == "" {
		return
	}
	v.Expose(proto.InsideAPIPort, func() (net.Conn, error) {
		return net.DialTimeout("unix", path, 5*time.Second)
	})
}
