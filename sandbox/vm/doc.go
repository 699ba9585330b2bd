// Package vm is the vm sandbox runtime: a Linux guest on tine's VMM with
// virtio devices (vmm/virtio), the guest agent over vsock, and forks that
// take memory and disk at one instant (docs/fork-hygiene.md).
//
// What exists so far is the probe that says whether this host can run it
// natively, only inside the nested harness, or not at all; the runtime
// itself (sandbox.Runtime) is not built yet.
package vm
