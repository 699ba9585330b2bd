package vmm

import (
	"fmt"
)

// PortDevice emulates a range of I/O ports. In fills data (1, 2 or 4
// bytes) for a guest IN; Out receives the bytes of a guest OUT. Both run
// on the vCPU's thread; port is the absolute port number.
type PortDevice interface {
	In(port uint16, data []byte)
	Out(port uint16, data []byte)
}

// MMIODevice emulates a range of guest-physical addresses outside RAM.
// Read fills data (1 to 8 bytes); Write receives the written bytes. Both
// run on the vCPU's thread; addr is the absolute guest-physical address.
type MMIODevice interface {
	Read(addr uint64, data []byte)
	Write(addr uint64, data []byte)
}

type portRange struct {
	base, size uint16
	dev        PortDevice
}

type mmioRange struct {
	base, size uint64
	dev        MMIODevice
}

// Hypercall ports of tine's bare-guest ABI. A guest writes with OUT:
//
//	PortConsole  1 byte: append it to the console (Config.Console)
//	PortReport   4 bytes: report a value (Config.OnReport, VM.Reports)
//	PortSnapshot any: ask for a snapshot (Config.OnRequest); RAX gets the result
//	PortFork     4 bytes: ask for that many children; RAX gets 0 in the
//	             parent and the child's index 1..N in each child
//	PortExit     4 bytes: end the guest with that exit code
//	PortFault    4 bytes: the exception vector (written by the bare
//	             guest's exception stubs); ends the VM with ErrGuestException
const (
	PortConsole  uint16 = 0x500
	PortReport   uint16 = 0x501
	PortSnapshot uint16 = 0x502
	PortFork     uint16 = 0x503
	PortExit     uint16 = 0x504
	PortFault    uint16 = 0x505

	hypercallBase = 0x500
	hypercallEnd  = 0x508
)

// AddPortDevice routes guest port I/O to ports base..base+size-1 to dev.
// Ranges must not overlap each other or the hypercall ports
// 0x500-0x507. Call it before Run.
func (vm *VM) AddPortDevice(base, size uint16, dev PortDevice) error {
	end := uint32(base) + uint32(size)
	if size == 0 || end > 0x10000 {
		return fmt.Errorf("vmm: port range %#x+%d is empty or past 0xffff", base, size)
	}
	if uint32(base) < hypercallEnd && end > hypercallBase {
		return fmt.Errorf("vmm: port range %#x+%d overlaps the hypercall ports", base, size)
	}
	for _, r := range vm.ports {
		if uint32(base) < uint32(r.base)+uint32(r.size) && end > uint32(r.base) {
			return fmt.Errorf("vmm: port range %#x+%d overlaps %#x+%d", base, size, r.base, r.size)
		}
	}
	vm.ports = append(vm.ports, portRange{base, size, dev})
	return nil
}

// AddMMIODevice routes guest accesses to guest-physical base..base+size-1
// to dev. The range must lie outside RAM and not overlap another. Call it
// before Run.
func (vm *VM) AddMMIODevice(base, size uint64, dev MMIODevice) error {
	end := base + size
	if size == 0 || end < base {
		return fmt.Errorf("vmm: MMIO range %#x+%d is empty or wraps", base, size)
	}
	if base < vm.cfg.MemSize {
		return fmt.Errorf("vmm: MMIO range %#x+%d overlaps guest RAM (0..%#x)", base, size, vm.cfg.MemSize)
	}
	for _, r := range vm.mmios {
		if base < r.base+r.size && end > r.base {
			return fmt.Errorf("vmm: MMIO range %#x+%d overlaps %#x+%d", base, size, r.base, r.size)
		}
	}
	vm.mmios = append(vm.mmios, mmioRange{base, size, dev})
	return nil
}

func (vm *VM) mmio(addr uint64, write bool, data []byte) bool {
	for _, r := range vm.mmios {
		if addr >= r.base && addr-r.base < r.size {
			if write {
				r.dev.Write(addr, data)
			} else {
				r.dev.Read(addr, data)
			}
			return true
		}
	}
	return false
}

func le32(b []byte) uint32 {
	var v uint32
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint32(b[i])
	}
	return v
}

// portIO handles one port access; done reports that the vCPU must stop.
func (vm *VM) portIO(c *VCPU, port uint16, out bool, data []byte) (loopResult, bool) {
	if port >= hypercallBase && port < hypercallEnd {
		if !out {
			clear(data)
			return loopResult{}, false
		}
		v := le32(data)
		switch port {
		case PortConsole:
			if vm.cfg.Console != nil {
				vm.cfg.Console.Write(data[:1])
			}
		case PortReport:
			vm.reports.add(v)
			if vm.cfg.OnReport != nil {
				vm.cfg.OnReport(vm, v)
			}
		case PortSnapshot:
			return loopResult{kind: resRequest, req: Request{Kind: RequestSnapshot, Arg: v, VCPU: c.id}}, true
		case PortFork:
			return loopResult{kind: resRequest, req: Request{Kind: RequestFork, Arg: v, VCPU: c.id}}, true
		case PortExit:
			vm.exitCode.Store(int64(int32(v)))
			return loopResult{kind: resExit}, true
		case PortFault:
			return loopResult{kind: resFault, err: c.exceptionFault(v)}, true
		default:
			return loopResult{kind: resFault, err: c.fault(ErrUnhandledPort, fmt.Sprintf("OUT to reserved port %#x", port))}, true
		}
		return loopResult{}, false
	}
	for _, r := range vm.ports {
		if port >= r.base && uint32(port) < uint32(r.base)+uint32(r.size) {
			if out {
				r.dev.Out(port, data)
			} else {
				r.dev.In(port, data)
			}
			return loopResult{}, false
		}
	}
	dir := "IN from"
	if out {
		dir = "OUT to"
	}
	return loopResult{kind: resFault, err: c.fault(ErrUnhandledPort, fmt.Sprintf("%d-byte %s port %#x", len(data), dir, port))}, true
}
