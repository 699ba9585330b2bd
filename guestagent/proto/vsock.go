package proto

// InsideAPIPort is the host vsock port (CID 2) that carries a vm
// sandbox's inside API: the guest agent forwards every connection to
// InsideAPISocket there, and the vm runtime bridges it to the sandbox's
// own API socket on the host.
const InsideAPIPort = 1025

// InsideAPISocket is where a sandbox's inside API is, in every runtime.
const InsideAPISocket = "/run/tine/api.sock"
