package vmm

import (
	"bytes"
	"testing"

	"tine/chunkstore"
	"tine/vmm/internal/kvmapi"
)

func sampleState() *State {
	st := &State{MemSize: 1 << 20, IRQChip: true, HasClock: true}
	st.Clock.Clock = 12345
	v := VCPUState{XSAVE: make([]byte, 4096), MSRs: []MSR{{0x10, 99}, {0xc0000080, 0xd00}}, LAPIC: new(kvmapi.LAPICState), MPState: 3}
	v.Regs.RIP = 0x100000
	v.Sregs.CR0 = 0x80050033
	v.XCRS.NrXRCS = 1
	v.XCRS.Registers[0].Value = 7
	st.VCPUs = append(st.VCPUs, v, v)
	return st
}

func TestStateRoundTrip(t *testing.T) {
	for _, st := range []*State{sampleState(), {MemSize: 4096, VCPUs: []VCPUState{{}}}} {
		b, err := st.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		got, err := UnmarshalState("test", b)
		if err != nil {
			t.Fatal(err)
		}
		b2, _ := got.MarshalBinary()
		if !bytes.Equal(b, b2) {
			t.Fatal("state changed in a round trip")
		}
		for _, cut := range []int{0, 5, len(b) / 2, len(b) - 1} {
			if _, err := UnmarshalState("test", b[:cut]); err == nil {
				t.Errorf("truncated state of %d bytes decoded", cut)
			}
		}
	}
}

func FuzzUnmarshalState(f *testing.F) {
	b, _ := sampleState().MarshalBinary()
	f.Add(b)
	f.Add([]byte(stateMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := UnmarshalState("fuzz", data)
		if err != nil {
			return
		}
		// Reserved fields are not kept, so compare a second round trip.
		b, err := st.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		st2, err := UnmarshalState("fuzz", b)
		if err != nil {
			t.Fatalf("re-encoded state does not decode: %v", err)
		}
		if b2, _ := st2.MarshalBinary(); !bytes.Equal(b, b2) {
			t.Fatal("state changed in a second round trip")
		}
	})
}

func FuzzDecodeSnapshotNodes(f *testing.F) {
	f.Add([]byte(snapMagic+"\x00\x00\x10\x00\x00\x00\x00\x00\x01"), 2, []byte{1, 0, 0, 0})
	f.Add(make([]byte, leafPages/8), 0, []byte{})
	f.Fuzz(func(t *testing.T, payload []byte, nlinks int, seed []byte) {
		if nlinks < 0 || nlinks > 600 {
			return
		}
		links := make([]chunkstore.ID, nlinks)
		for i := range links {
			if len(seed) > 0 {
				links[i][0] = seed[i%len(seed)]
			}
		}
		decodeRoot("fuzz", links, payload)
		var ids [leafPages]chunkstore.ID
		decodeLeaf("fuzz", links, payload, &ids)
	})
}
