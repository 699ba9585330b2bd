package linux

import (
	"context"
	"fmt"

	"tine/vmm"
	"tine/vmm/serial"
	"tine/vmm/virtio"
)

// MachineImage is a Machine at one instant: its memory sealed into an
// immutable image, its vCPU and irqchip state, and the driver-visible
// state of its UART and virtio transports. Clones made from it later are
// separate machines that resume at that instant.
type MachineImage struct {
	img    *vmm.Image
	boot   *Boot
	uart   serial.State
	states []virtio.State
	types  []uint32
	dev    [][]byte // each device's own state (virtio.StatefulDevice); nil for none
}

// devState is device i's own state, or nil.
func (mi *MachineImage) devState(i int) []byte {
	if i < len(mi.dev) {
		return mi.dev[i]
	}
	return nil
}

// Seal takes the machine's state and seals its memory; the machine goes
// on as a child of the image. The VM is paused for the duration (it may
// already be paused by the caller: pauses nest).
func (m *Machine) Seal() (*MachineImage, error) {
	m.VM.Pause()
	defer m.VM.Resume()
	mi := &MachineImage{boot: m.Boot}
	// Hold every transport until memory is sealed: a device's host-side
	// work (a received frame) must not change memory the state was
	// taken before.
	ds, release, err := m.holdDevices()
	defer release()
	if err != nil {
		return nil, fmt.Errorf("linux machine: seal: %w", err)
	}
	mi.states, mi.dev = ds.states, ds.own
	for _, t := range m.Virtio {
		mi.types = append(mi.types, t.Device().Type())
	}
	mi.uart = m.UART.State()
	img, err := m.VM.Seal()
	if err != nil {
		return nil, fmt.Errorf("linux machine: seal: %w", err)
	}
	mi.img = img
	return mi, nil
}

// Clone makes a machine from the image with cfg's Console, Ports and
// Virtio devices (the same types, in the same order, as the sealed
// machine's; MachineConfig's memory, vCPUs and kernel are the image's).
// Its vsock device sends TRANSPORT_RESET before it runs. Start it with
// Run.
func (mi *MachineImage) Clone(ctx context.Context, cfg MachineConfig) (*Machine, error) {
	if len(cfg.Virtio) != len(mi.types) {
		return nil, fmt.Errorf("linux machine clone: %d virtio devices, the image has %d", len(cfg.Virtio), len(mi.types))
	}
	for j, d := range cfg.Virtio {
		if d.Type() != mi.types[j] {
			return nil, fmt.Errorf("linux machine clone: device %d is type %d, the image's type %d", j, d.Type(), mi.types[j])
		}
	}
	vms, err := mi.img.Fork(ctx, 1, vmm.ForkOptions{})
	if err != nil {
		return nil, fmt.Errorf("linux machine clone: %w", err)
	}
	k := &Machine{VM: vms[0], Boot: mi.boot}
	if err := k.addPortDevices(cfg, &mi.uart); err != nil {
		vms[0].Close()
		return nil, fmt.Errorf("linux machine clone: %w", err)
	}
	if _, err := k.addVirtio(cfg.Virtio); err != nil {
		k.Close()
		return nil, fmt.Errorf("linux machine clone: %w", err)
	}
	if err := k.setDevices(deviceState{states: mi.states, own: mi.dev}); err != nil {
		k.Close()
		return nil, fmt.Errorf("linux machine clone: %w", err)
	}
	return k, nil
}

// DeviceTypes are the virtio device types of the sealed machine, in
// order: a clone gets devices of these types.
func (mi *MachineImage) DeviceTypes() []uint32 { return append([]uint32(nil), mi.types...) }

// Close releases the image; clones made from it keep what they map.
func (mi *MachineImage) Close() error { return mi.img.Close() }

// deviceState is the state of a machine's virtio devices at one instant:
// each transport's, and each device's own (nil for none).
type deviceState struct {
	states []virtio.State
	own    [][]byte
}

// holdDevices locks every transport (until release is called, which it
// must be, error or not) and takes their state and the own state of each
// virtio.StatefulDevice. Call it with the VM paused.
func (m *Machine) holdDevices() (deviceState, func(), error) {
	var ds deviceState
	var releases []func()
	release := func() {
		for _, r := range releases {
			r()
		}
	}
	for i, t := range m.Virtio {
		s, r := t.Hold()
		releases = append(releases, r)
		var own []byte
		if sd, ok := t.Device().(virtio.StatefulDevice); ok {
			b, err := sd.SaveState()
			if err != nil {
				return ds, release, fmt.Errorf("device %d (type %d): %w", i, sd.Type(), err)
			}
			if len(b) > virtio.MaxDeviceState {
				return ds, release, fmt.Errorf("device %d (type %d) has %d bytes of state, at most %d", i, sd.Type(), len(b), virtio.MaxDeviceState)
			}
			own = b
		}
		ds.states = append(ds.states, s)
		ds.own = append(ds.own, own)
	}
	return ds, release, nil
}

// setDevices loads ds into the transports and devices of a new clone,
// before it runs, and has its vsock device send TRANSPORT_RESET.
func (k *Machine) setDevices(ds deviceState) error {
	for j, t := range k.Virtio {
		if err := t.SetState(ds.states[j]); err != nil {
			return err
		}
		if j < len(ds.own) && len(ds.own[j]) > 0 {
			sd, ok := t.Device().(virtio.StatefulDevice)
			if !ok {
				return fmt.Errorf("device %d (type %d) has saved state and cannot take it", j, t.Device().Type())
			}
			if err := sd.RestoreState(t, ds.own[j]); err != nil {
				return fmt.Errorf("device %d (type %d): %w", j, t.Device().Type(), err)
			}
		}
		if v, ok := t.Device().(*virtio.Vsock); ok {
			if err := v.ResetTransport(t); err != nil {
				return err
			}
		}
	}
	return nil
}
