package vmm

import (
	"errors"
	"fmt"

	"tine/vmm/internal/kvmapi"
)

// MSR is one model-specific register and its value.
type MSR struct {
	Index uint32
	Value uint64
}

// VCPUState is everything KVM holds for one vCPU.
type VCPUState struct {
	Regs      Regs
	Sregs     Sregs
	XSAVE     []byte // FPU/SSE/AVX state, KVM_GET_XSAVE(2) layout
	XCRS      XCRS
	MSRs      []MSR
	LAPIC     *LAPICState // nil without the in-kernel irqchip
	Events    VCPUEvents
	MPState   uint32
	DebugRegs DebugRegs
}

// State is a VM's complete machine state apart from RAM: every vCPU and,
// with the in-kernel irqchip, the PICs, IOAPIC, PIT and kvmclock.
type State struct {
	MemSize  uint64
	VCPUs    []VCPUState
	IRQChip  bool
	Chips    [3]IRQChip // PIC master, PIC slave, IOAPIC
	PIT      PITState2
	Clock    ClockData
	HasClock bool
}

// CaptureState reads the complete state of a stopped VM (call it while
// paused or between runs).
func (vm *VM) CaptureState() (*State, error) {
	if err := vm.userfaultErr(); err != nil {
		return nil, fmt.Errorf("vmm: RAM is incomplete, the VM cannot be captured: %w", err)
	}
	st := &State{MemSize: vm.cfg.MemSize, IRQChip: vm.cfg.IRQChip}
	for _, c := range vm.vcpus {
		cs, err := c.capture()
		if err != nil {
			return nil, err
		}
		st.VCPUs = append(st.VCPUs, *cs)
	}
	if vm.cfg.IRQChip {
		fd := uintptr(vm.vmFd)
		for i := range st.Chips {
			st.Chips[i].ChipID = uint32(i)
			if err := kvmapi.GetIRQChip(fd, &st.Chips[i]); err != nil {
				return nil, fmt.Errorf("vmm: KVM_GET_IRQCHIP %d: %w", i, err)
			}
		}
		if err := kvmapi.GetPIT2(fd, &st.PIT); err != nil {
			return nil, fmt.Errorf("vmm: KVM_GET_PIT2: %w", err)
		}
	}
	// kvmclock is VM-wide and exists with or without the irqchip.
	if err := kvmapi.GetClock(uintptr(vm.vmFd), &st.Clock); err == nil {
		st.HasClock = true
	}
	return st, nil
}

func (c *VCPU) capture() (*VCPUState, error) {
	fd := uintptr(c.fd)
	s := &VCPUState{}
	r, err := kvmapi.GetRegs(fd)
	if err != nil {
		return nil, fmt.Errorf("vmm: KVM_GET_REGS on vCPU %d: %w", c.id, err)
	}
	s.Regs = *r
	sr, err := kvmapi.GetSregs(fd)
	if err != nil {
		return nil, fmt.Errorf("vmm: KVM_GET_SREGS on vCPU %d: %w", c.id, err)
	}
	s.Sregs = *sr
	s.XSAVE = make([]byte, c.vm.xsaveSize)
	if err := kvmapi.GetXSAVE(c.fd, s.XSAVE); err != nil {
		return nil, fmt.Errorf("vmm: vCPU %d: %w", c.id, err)
	}
	if err := kvmapi.GetXCRS(fd, &s.XCRS); err != nil {
		return nil, fmt.Errorf("vmm: KVM_GET_XCRS on vCPU %d: %w", c.id, err)
	}
	s.MSRs, err = c.readMSRs()
	if err != nil {
		return nil, err
	}
	if c.vm.cfg.IRQChip {
		s.LAPIC = new(kvmapi.LAPICState)
		if err := kvmapi.GetLocalAPIC(fd, s.LAPIC); err != nil {
			return nil, fmt.Errorf("vmm: KVM_GET_LAPIC on vCPU %d: %w", c.id, err)
		}
	}
	if err := kvmapi.GetVCPUEvents(fd, &s.Events); err != nil {
		return nil, fmt.Errorf("vmm: KVM_GET_VCPU_EVENTS on vCPU %d: %w", c.id, err)
	}
	var mp kvmapi.MPState
	if err := kvmapi.GetMPState(fd, &mp); err != nil {
		return nil, fmt.Errorf("vmm: KVM_GET_MP_STATE on vCPU %d: %w", c.id, err)
	}
	s.MPState = mp.State
	if err := kvmapi.GetDebugRegs(fd, &s.DebugRegs); err != nil {
		return nil, fmt.Errorf("vmm: KVM_GET_DEBUGREGS on vCPU %d: %w", c.id, err)
	}
	return s, nil
}

// readMSRs reads every MSR of KVM's index list. KVM stops at the first
// MSR it cannot read; such MSRs are skipped (on PVM, some of the list are
// not readable for a given vCPU configuration).
func (c *VCPU) readMSRs() ([]MSR, error) {
	idx := c.vm.msrIndices
	entries := make([]kvmapi.MSREntry, len(idx))
	for i, x := range idx {
		entries[i].Index = x
	}
	var out []MSR
	for len(entries) > 0 {
		n, err := kvmapi.GetMSRs(c.fd, entries)
		if err != nil {
			return nil, fmt.Errorf("vmm: vCPU %d: %w", c.id, err)
		}
		for _, e := range entries[:n] {
			out = append(out, MSR{Index: e.Index, Value: e.Data})
		}
		if n < len(entries) {
			n++ // skip the unreadable one
		}
		entries = entries[n:]
	}
	return out, nil
}

// RestoreState loads st into a stopped VM with the same RAM size, vCPU
// count and irqchip setting. vCPU order: sregs, XCRS, XSAVE, regs,
// LAPIC, MSRs, MP state, then events and debug registers. The IOAPIC is
// read back before its redirect table is overwritten.
func (vm *VM) RestoreState(st *State) error {
	if st.MemSize != vm.cfg.MemSize || len(st.VCPUs) != len(vm.vcpus) || st.IRQChip != vm.cfg.IRQChip {
		return fmt.Errorf("vmm: state for %d bytes, %d vCPUs, irqchip %v does not fit VM with %d bytes, %d vCPUs, irqchip %v",
			st.MemSize, len(st.VCPUs), st.IRQChip, vm.cfg.MemSize, len(vm.vcpus), vm.cfg.IRQChip)
	}
	if st.IRQChip {
		fd := uintptr(vm.vmFd)
		for i := range st.Chips {
			chip := st.Chips[i]
			if i == 2 {
				cur := kvmapi.IRQChip{ChipID: 2}
				if err := kvmapi.GetIRQChip(fd, &cur); err != nil {
					return fmt.Errorf("vmm: KVM_GET_IRQCHIP IOAPIC: %w", err)
				}
				cur.Chip = chip.Chip
				chip = cur
			}
			chip.ChipID = uint32(i)
			if err := kvmapi.SetIRQChip(fd, &chip); err != nil {
				return fmt.Errorf("vmm: KVM_SET_IRQCHIP %d: %w", i, err)
			}
		}
		pit := st.PIT
		if err := kvmapi.SetPIT2(fd, &pit); err != nil {
			return fmt.Errorf("vmm: KVM_SET_PIT2: %w", err)
		}
	}
	for i, c := range vm.vcpus {
		if err := c.restore(&st.VCPUs[i]); err != nil {
			return err
		}
	}
	if st.HasClock {
		clk := st.Clock
		clk.Flags = 0
		if err := kvmapi.SetClock(uintptr(vm.vmFd), &clk); err != nil {
			return fmt.Errorf("vmm: KVM_SET_CLOCK: %w", err)
		}
	}
	return nil
}

func (c *VCPU) restore(s *VCPUState) error {
	fd := uintptr(c.fd)
	sr := s.Sregs
	if err := kvmapi.SetSregs(fd, &sr); err != nil {
		return fmt.Errorf("vmm: KVM_SET_SREGS on vCPU %d: %w", c.id, err)
	}
	x := s.XCRS
	if x.NrXRCS > 0 {
		if err := kvmapi.SetXCRS(fd, &x); err != nil {
			return fmt.Errorf("vmm: KVM_SET_XCRS on vCPU %d: %w", c.id, err)
		}
	}
	if len(s.XSAVE) > 0 {
		buf := s.XSAVE
		if len(buf) < c.vm.xsaveSize {
			buf = make([]byte, c.vm.xsaveSize)
			copy(buf, s.XSAVE)
		}
		if err := kvmapi.SetXSAVE(c.fd, buf); err != nil {
			return fmt.Errorf("vmm: vCPU %d: %w", c.id, err)
		}
	}
	r := s.Regs
	if err := kvmapi.SetRegs(fd, &r); err != nil {
		return fmt.Errorf("vmm: KVM_SET_REGS on vCPU %d: %w", c.id, err)
	}
	if s.LAPIC != nil {
		l := *s.LAPIC
		if err := kvmapi.SetLocalAPIC(fd, &l); err != nil {
			return fmt.Errorf("vmm: KVM_SET_LAPIC on vCPU %d: %w", c.id, err)
		}
	}
	if err := c.writeMSRs(s.MSRs); err != nil {
		return err
	}
	mp := kvmapi.MPState{State: s.MPState}
	if err := kvmapi.SetMPState(fd, &mp); err != nil {
		return fmt.Errorf("vmm: KVM_SET_MP_STATE on vCPU %d: %w", c.id, err)
	}
	ev := s.Events
	if err := kvmapi.SetVCPUEvents(fd, &ev); err != nil {
		return fmt.Errorf("vmm: KVM_SET_VCPU_EVENTS on vCPU %d: %w", c.id, err)
	}
	dr := s.DebugRegs
	if err := kvmapi.SetDebugRegs(fd, &dr); err != nil {
		return fmt.Errorf("vmm: KVM_SET_DEBUGREGS on vCPU %d: %w", c.id, err)
	}
	return nil
}

// writeMSRs writes the MSRs, skipping any KVM refuses (it stops at the
// first one), like readMSRs.
func (c *VCPU) writeMSRs(msrs []MSR) error {
	entries := make([]kvmapi.MSREntry, len(msrs))
	for i, m := range msrs {
		entries[i] = kvmapi.MSREntry{Index: m.Index, Data: m.Value}
	}
	for len(entries) > 0 {
		n, err := kvmapi.SetMSRs(c.fd, entries)
		if err != nil {
			return fmt.Errorf("vmm: vCPU %d: %w", c.id, err)
		}
		if n < len(entries) {
			n++
		}
		entries = entries[n:]
	}
	return nil
}

var errStateFormat = errors.New("bad machine state encoding")
