package kvmapi

import "unsafe"

// Capabilities for eventfd-driven devices.
const (
	CapIRQFD     = 32
	CapIOEventFD = 36
)

const (
	nrIRQFD     = 0x76
	nrIOEventFD = 0x79

	// IOEventFDDatamatch makes an ioeventfd fire only for one value.
	IOEventFDDatamatch = 1 << 0
)

// IRQFD binds an eventfd to a GSI of the in-kernel irqchip: each write
// to the eventfd injects an edge on that GSI.
func IRQFD(vmFd, eventFd int, gsi uint32) error {
	arg := struct {
		FD, GSI, Flags, ResampleFD uint32
		_                          [16]byte
	}{FD: uint32(eventFd), GSI: gsi}
	_, err := ioctl(vmFd, iow(nrIRQFD, unsafe.Sizeof(arg)), uintptr(unsafe.Pointer(&arg)))
	return err
}

// IOEventFD makes a guest write of size bytes to MMIO address addr
// (carrying datamatch, when match is set) signal eventFd instead of
// exiting to userspace.
func IOEventFD(vmFd, eventFd int, addr uint64, size uint32, datamatch uint64, match bool) error {
	arg := struct {
		Datamatch, Addr uint64
		Len             uint32
		FD              int32
		Flags           uint32
		_               [36]byte
	}{Datamatch: datamatch, Addr: addr, Len: size, FD: int32(eventFd)}
	if match {
		arg.Flags = IOEventFDDatamatch
	}
	_, err := ioctl(vmFd, iow(nrIOEventFD, unsafe.Sizeof(arg)), uintptr(unsafe.Pointer(&arg)))
	return err
}
