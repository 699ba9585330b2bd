package vmm

import (
	"fmt"

	"tine/vmm/internal/kvmapi"
)

// SetGuestCPUID gives every vCPU the host's supported CPUID adjusted for a
// general-purpose guest kernel: the hypervisor bit (without it Linux looks
// for no hypervisor, so no kvm-clock) and each vCPU's own APIC ID in leaves
// 0x1, 0xB and 0x1F. Call it before Run.
func (vm *VM) SetGuestCPUID() error {
	base := &kvmapi.CPUID{Nent: 256, Entries: make([]kvmapi.CPUIDEntry, 256)}
	if err := kvmapi.GetSupportedCPUID(vm.kvm.Fd(), base); err != nil {
		return fmt.Errorf("vmm: KVM_GET_SUPPORTED_CPUID: %w", err)
	}
	for _, c := range vm.vcpus {
		cpuid := &kvmapi.CPUID{Nent: base.Nent, Entries: append([]kvmapi.CPUIDEntry(nil), base.Entries[:base.Nent]...)}
		id := uint32(c.id)
		for i := range cpuid.Entries {
			e := &cpuid.Entries[i]
			switch e.Function {
			case 0x1:
				e.Ecx |= 1 << 31 // hypervisor present
				e.Ebx = e.Ebx&0x00ffffff | id<<24
			case 0xb, 0x1f:
				e.Edx = id
			}
		}
		var err error
		c.do(func() { err = kvmapi.SetCPUID2(uintptr(c.fd), cpuid) })
		if err != nil {
			return fmt.Errorf("vmm: KVM_SET_CPUID2 on vCPU %d: %w", c.id, err)
		}
	}
	return nil
}
