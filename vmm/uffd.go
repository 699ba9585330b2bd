package vmm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PageSource serves the pages of a memory image on demand (userfaultfd
// fork mode). ReadPage fills buf (PageSize bytes) with the page at byte
// offset off, or returns zero == true for an all-zero page.
type PageSource interface {
	ReadPage(off uint64, buf []byte) (zero bool, err error)
}

type imageSource struct{ img *Image }

// ReadPage reads a page of the image file.
func (s imageSource) ReadPage(off uint64, buf []byte) (bool, error) {
	n, err := unix.Pread(s.img.fd, buf, int64(off))
	if err != nil {
		return false, fmt.Errorf("vmm: read image page at %d: %w", off, err)
	}
	clear(buf[n:])
	return isZeroPage(buf), nil
}

// userfaultfd ioctls and structures (linux/userfaultfd.h).
const (
	uffdAPI             = 0xAA
	uffdioAPI           = 3<<30 | 24<<16 | 0xAA<<8 | 0x3F
	uffdioRegister      = 3<<30 | 32<<16 | 0xAA<<8 | 0x00
	uffdioCopy          = 3<<30 | 40<<16 | 0xAA<<8 | 0x03
	uffdioZeropage      = 3<<30 | 32<<16 | 0xAA<<8 | 0x04
	uffdRegisterMissing = 1
	uffdEventPagefault  = 0x12
	uffdMsgSize         = 32
)

type userfault struct {
	fd   int    // owned by the handler goroutine, which closes it
	stop [2]int // pipe: closing the write end stops the handler
	done chan struct{}
	err  atomic.Pointer[error] // why the handler stopped early
}

// startUserfault replaces the VM's RAM with anonymous memory registered
// with a userfaultfd, and serves its missing pages from src on a handler
// goroutine until the VM is closed or a page cannot be served.
func (vm *VM) startUserfault(src PageSource) error {
	if _, err := unix.MmapPtr(-1, 0, unsafePointer(vm.mem), uintptr(vm.cfg.MemSize),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE); err != nil {
		return fmt.Errorf("vmm: map anonymous guest RAM: %w", err)
	}
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		return fmt.Errorf("vmm: userfaultfd: %w", errno)
	}
	uf := &userfault{fd: int(fd), done: make(chan struct{})}
	api := [3]uint64{uffdAPI, 0, 0}
	if err := uffdIoctl(uf.fd, uffdioAPI, unsafe.Pointer(&api)); err != nil {
		unix.Close(uf.fd)
		return fmt.Errorf("vmm: UFFDIO_API: %w", err)
	}
	reg := [4]uint64{uint64(uintptr(unsafePointer(vm.mem))), vm.cfg.MemSize, uffdRegisterMissing, 0}
	if err := uffdIoctl(uf.fd, uffdioRegister, unsafe.Pointer(&reg)); err != nil {
		unix.Close(uf.fd)
		return fmt.Errorf("vmm: UFFDIO_REGISTER of %d bytes: %w", vm.cfg.MemSize, err)
	}
	if err := unix.Pipe2(uf.stop[:], unix.O_CLOEXEC); err != nil {
		unix.Close(uf.fd)
		return fmt.Errorf("vmm: pipe: %w", err)
	}
	vm.uffd = uf
	mem := vm.mem
	go func() {
		defer close(uf.done)
		if err := uf.serve(mem, src); err != nil {
			// Recorded before the vCPUs wake, so that Run returns it.
			uf.err.Store(&err)
			select {
			case vm.kick <- struct{}{}:
			default:
			}
		}
		// Closing the userfaultfd wakes every thread blocked on a missing
		// page (vCPUs in KVM, host readers of Mem) and unregisters RAM:
		// pages never served read as zeros from now on, so nothing hangs.
		unix.Close(uf.fd)
	}()
	return nil
}

func uffdIoctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// serve answers page faults until the stop pipe closes (nil) or a page
// cannot be served (the error, naming the page).
func (uf *userfault) serve(mem []byte, src PageSource) error {
	base := uint64(uintptr(unsafePointer(mem)))
	size := uint64(len(mem))
	page := make([]byte, PageSize)
	msgs := make([]byte, uffdMsgSize*16)
	fds := []unix.PollFd{{Fd: int32(uf.fd), Events: unix.POLLIN}, {Fd: int32(uf.stop[0]), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("vmm: poll userfaultfd: %w", err)
		}
		if fds[1].Revents != 0 {
			return nil
		}
		n, err := unix.Read(uf.fd, msgs)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("vmm: read userfaultfd: %w", err)
		}
		for m := 0; m+uffdMsgSize <= n; m += uffdMsgSize {
			msg := msgs[m : m+uffdMsgSize]
			if msg[0] != uffdEventPagefault {
				continue
			}
			addr := binary.LittleEndian.Uint64(msg[16:]) &^ (PageSize - 1)
			if addr < base || addr-base >= size {
				continue
			}
			if err := uf.fill(addr, addr-base, src, page); err != nil {
				return fmt.Errorf("vmm: serve guest page at %#x: %w", addr-base, err)
			}
		}
	}
}

// fill maps the page at guest-physical off (host address addr) from src.
func (uf *userfault) fill(addr, off uint64, src PageSource, page []byte) error {
	zero, err := src.ReadPage(off, page)
	if err != nil {
		return err
	}
	if zero {
		z := [4]uint64{addr, PageSize, 0, 0}
		err = uffdIoctl(uf.fd, uffdioZeropage, unsafe.Pointer(&z))
	} else {
		c := [5]uint64{addr, uint64(uintptr(unsafePointer(page))), PageSize, 0, 0}
		err = uffdIoctl(uf.fd, uffdioCopy, unsafe.Pointer(&c))
	}
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("map it into guest RAM: %w", err)
	}
	return nil
}

func (uf *userfault) close() {
	unix.Close(uf.stop[1])
	<-uf.done
	unix.Close(uf.stop[0])
}
