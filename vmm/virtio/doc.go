// Package virtio is tine's virtio device model: the virtio-mmio transport
// (version 2, described to Linux in the ACPI DSDT; ADR 0170), the split
// virtqueue, and the devices (rng, console, vsock, block), one file each.
//
// Everything a guest writes is hostile. Descriptor addresses and lengths,
// ring indexes, chain links and request headers are checked against guest
// RAM and against the queue; a bad one puts that device into the
// DEVICE_NEEDS_RESET state with an error naming the queue and the
// descriptor. The host process goes on, and nothing a guest writes sizes
// an allocation beyond fixed per-device bounds.
//
// The package does not need KVM: a device works on any []byte standing
// for guest RAM, so tests build guest memory in-process. vmm/linux wires
// devices to a VM (MMIO exits or ioeventfds for notifications, irqfds or
// KVM_IRQ_LINE for interrupts).
package virtio
