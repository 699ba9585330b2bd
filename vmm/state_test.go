package vmm

import (
	"context"
	"testing"
)

// TestStateIRQChip captures and restores a VM with the in-kernel irqchip,
// PIT and kvmclock, as Linux guests use, and checks what came back.
func TestStateIRQChip(t *testing.T) {
	needKVM(t)
	vm, err := New(context.Background(), Config{MemSize: 8 << 20, VCPUs: 2, IRQChip: true})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	st, err := vm.CaptureState()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("captured %d MSRs of %d listed, XSAVE %d bytes, clock %v", len(st.VCPUs[0].MSRs), len(vm.msrIndices), len(st.VCPUs[0].XSAVE), st.HasClock)
	if len(st.VCPUs) != 2 || st.VCPUs[0].LAPIC == nil {
		t.Fatalf("state lacks vCPUs or LAPIC: %d vCPUs", len(st.VCPUs))
	}
	st.VCPUs[1].Regs.RBX = 0x1234
	b, err := st.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	st2, err := UnmarshalState("test", b)
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(context.Background(), Config{MemSize: 8 << 20, VCPUs: 2, IRQChip: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.RestoreState(st2); err != nil {
		t.Fatal(err)
	}
	r, err := other.VCPU(1).Regs()
	if err != nil {
		t.Fatal(err)
	}
	if r.RBX != 0x1234 {
		t.Errorf("RBX after restore = %#x, want 0x1234", r.RBX)
	}
	back, err := other.CaptureState()
	if err != nil {
		t.Fatal(err)
	}
	if back.Chips[0].Chip != st.Chips[0].Chip || back.Chips[2].Chip != st.Chips[2].Chip {
		t.Error("irqchip state differs after restore")
	}
	if *back.VCPUs[0].LAPIC != *st.VCPUs[0].LAPIC {
		t.Error("LAPIC differs after restore")
	}
}
