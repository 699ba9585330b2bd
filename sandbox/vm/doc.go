// Package vm is the vm sandbox runtime: a Linux guest on tine's VMM with
// virtio devices (vmm/virtio), the guest agent as pid 1 reached over
// vsock through a host-side bridge socket, and forks that take memory
// and disk at one instant, each clone told the fork-hygiene step before
// it runs user work (docs/fork-hygiene.md). Probe says whether this host
// can run it natively, only inside the nested harness, or not at all.
package vm
