package main

import (
	"fmt"
	"os"

	"tine/guestagent"
	"tine/guestagent/proto"
)

// vmInsideAPI serves the sandbox's inside API at /run/tine/api.sock in
// a VM guest: each connection goes to host vsock port
// proto.InsideAPIPort, which the vm runtime exposes when the sandbox
// has an inside API (a sandbox without one has its connections reset).
// A failure is reported on the console; the guest runs on without it.
func vmInsideAPI() {
	if _, err := guestagent.ForwardInsideAPI(proto.InsideAPISocket, proto.InsideAPIPort); err != nil {
		fmt.Fprintln(os.Stderr, "tine-agent: the inside API:", err)
	}
}
