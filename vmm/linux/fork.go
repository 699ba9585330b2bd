package linux

import (
	"context"
	"fmt"

	"tine/vmm"
	"tine/vmm/virtio"
)

// ForkConfig says what each clone of a Machine gets.
type ForkConfig struct {
	// Config gives clone i (from 1) its Console and Ports; the rest of
	// the MachineConfig is ignored (memory, vCPUs and kernel are the
	// parent's, the virtio devices come from Devices). Nil: no console.
	Config func(i int) MachineConfig
	// Prepare runs once while the parent is paused, after its devices'
	// state was taken and before its memory is sealed: fork the disk
	// images here, so that they fork at the same instant as memory.
	Prepare func() error
	// Devices returns clone i's virtio devices, one per device of the
	// parent, of the same types and in the same order (the forked disk
	// image, a Vsock listening on the clone's own socket, ...).
	Devices func(i int) ([]virtio.Device, error)
}

// Fork pauses the machine, takes its device state, seals its memory and
// makes n clones that resume at the same instruction with the same
// devices (driver-visible state carried over). Each clone's vsock device
// sends TRANSPORT_RESET before the clone runs (docs/fork-hygiene.md). The
// parent goes on when Fork returns; the clones are started with Run.
func (m *Machine) Fork(ctx context.Context, n int, fc ForkConfig) ([]*Machine, error) {
	m.VM.Pause()
	defer m.VM.Resume()
	uart := m.UART.State()
	// Transports are held until memory is sealed (see Seal).
	ds, release, err := m.holdDevices()
	defer release()
	if err != nil {
		return nil, fmt.Errorf("linux machine fork: %w", err)
	}
	if fc.Prepare != nil {
		if err := fc.Prepare(); err != nil {
			return nil, fmt.Errorf("linux machine fork: %w", err)
		}
	}
	_, vms, err := m.VM.Fork(ctx, n, vmm.ForkOptions{})
	if err != nil {
		return nil, fmt.Errorf("linux machine fork: %w", err)
	}
	kids := make([]*Machine, 0, n)
	fail := func(err error) ([]*Machine, error) {
		for _, k := range kids {
			k.Close()
		}
		for _, v := range vms[len(kids):] {
			v.Close()
		}
		return nil, fmt.Errorf("linux machine fork: %w", err)
	}
	for i, vm := range vms {
		var cfg MachineConfig
		if fc.Config != nil {
			cfg = fc.Config(i + 1)
		}
		cfg.Virtio = nil
		if fc.Devices != nil {
			if cfg.Virtio, err = fc.Devices(i + 1); err != nil {
				return fail(err)
			}
		}
		if len(cfg.Virtio) != len(m.Virtio) {
			vm.Close()
			return fail(fmt.Errorf("clone %d has %d virtio devices, the parent %d", i+1, len(cfg.Virtio), len(m.Virtio)))
		}
		k := &Machine{VM: vm, Boot: m.Boot}
		if err := k.addPortDevices(cfg, &uart); err != nil {
			vm.Close()
			return fail(err)
		}
		if _, err := k.addVirtio(cfg.Virtio); err != nil {
			k.Close()
			return fail(err)
		}
		for j, t := range k.Virtio {
			if t.Device().Type() != m.Virtio[j].Device().Type() {
				k.Close()
				return fail(fmt.Errorf("clone %d device %d is type %d, the parent's type %d", i+1, j, t.Device().Type(), m.Virtio[j].Device().Type()))
			}
		}
		if err := k.setDevices(ds); err != nil {
			k.Close()
			return fail(err)
		}
		kids = append(kids, k)
	}
	return kids, nil
}
