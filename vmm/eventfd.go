package vmm

import (
	"fmt"

	"golang.org/x/sys/unix"

	"tine/vmm/internal/kvmapi"
)

// HasIRQFD reports whether KVM can inject interrupts from eventfds.
func (vm *VM) HasIRQFD() bool { return kvmapi.CheckExtension(vm.vmFd, kvmapi.CapIRQFD) > 0 }

// HasIOEventFD reports whether KVM can turn MMIO writes into eventfd
// signals.
func (vm *VM) HasIOEventFD() bool { return kvmapi.CheckExtension(vm.vmFd, kvmapi.CapIOEventFD) > 0 }

// IRQFD returns an eventfd bound to GSI gsi of the in-kernel irqchip
// (Config.IRQChip): writing 1 to it injects an edge. The caller closes it.
func (vm *VM) IRQFD(gsi uint32) (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("vmm: eventfd for GSI %d: %w", gsi, err)
	}
	if err := kvmapi.IRQFD(vm.vmFd, fd, gsi); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("vmm: KVM_IRQFD for GSI %d: %w", gsi, err)
	}
	return fd, nil
}

// IOEventFD returns an eventfd that a guest's 4-byte write of value to
// MMIO address addr signals, without a vCPU exit to the VMM. The address
// must also belong to an MMIO device (AddMMIODevice) for other values.
// The caller reads and closes it.
func (vm *VM) IOEventFD(addr uint64, value uint32) (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("vmm: eventfd for MMIO %#x: %w", addr, err)
	}
	if err := kvmapi.IOEventFD(vm.vmFd, fd, addr, 4, uint64(value), true); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("vmm: KVM_IOEVENTFD at %#x value %d: %w", addr, value, err)
	}
	return fd, nil
}
