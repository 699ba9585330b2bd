package vmm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"tine/vmm/internal/kvmapi"
)

// Errors a guest can end its VM with. A *GuestError wraps one of them.
var (
	ErrTripleFault    = errors.New("triple fault (shutdown)")
	ErrUnhandledPort  = errors.New("access to an unhandled I/O port")
	ErrUnhandledMMIO  = errors.New("access to unmapped guest-physical memory")
	ErrGuestException = errors.New("unhandled guest exception")
	ErrHalted         = errors.New("guest halted with nothing to wake it")
	ErrKVMInternal    = errors.New("KVM internal error")
	ErrEntryFailed    = errors.New("KVM failed to enter the guest")
	ErrBadExit        = errors.New("unexpected KVM exit")
	ErrBadRequest     = errors.New("guest request not handled")
	// ErrClosed is returned by Run on a VM that is or gets closed.
	ErrClosed = errors.New("vmm: VM closed")
)

// GuestError is how a VM ends when its guest misbehaves. It names the
// vCPU and the guest instruction pointer.
type GuestError struct {
	VCPU   int
	RIP    uint64
	Detail string
	Err    error
}

// Error describes the fault with the vCPU and guest RIP.
func (e *GuestError) Error() string {
	s := fmt.Sprintf("vmm: guest fault on vCPU %d at rip %#x: %v", e.VCPU, e.RIP, e.Err)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the kind of fault, one of the Err* values.
func (e *GuestError) Unwrap() error { return e.Err }

// RequestKind says what a guest asks of the VMM.
type RequestKind int

// Request kinds.
const (
	// RequestSnapshot asks the host to snapshot the VM.
	RequestSnapshot RequestKind = iota + 1
	// RequestFork asks the host to fork the VM into Arg children.
	RequestFork
)

// Request is a guest's snapshot or fork request.
type Request struct {
	Kind RequestKind
	Arg  uint32
	VCPU int
}

type resultKind int

const (
	resStopped resultKind = iota
	resExit
	resFault
	resRequest
)

type loopResult struct {
	kind resultKind
	err  error
	req  Request
}

// Run runs the guest until it exits (nil), faults (a *GuestError), or ctx
// ends (ctx.Err()). The VM can be paused, snapshotted and forked from other
// goroutines meanwhile. After a fault or exit the VM stays stopped; Run
// may be called again after ctx ended.
func (vm *VM) Run(ctx context.Context) error {
	vm.runMu.Lock()
	defer vm.runMu.Unlock()
	if vm.exited.Load() {
		return errors.New("vmm: Run on a VM whose guest has exited")
	}
	if err := vm.userfaultErr(); err != nil {
		return err
	}
	n := len(vm.vcpus)
	results := make(chan loopResult, n)
	for {
		vm.mu.Lock()
		for vm.pauses > 0 && !vm.closed {
			vm.cond.Wait()
		}
		if vm.closed {
			vm.mu.Unlock()
			return ErrClosed
		}
		if err := ctx.Err(); err != nil {
			vm.mu.Unlock()
			return err
		}
		vm.running = true
		select {
		case <-vm.kick:
		default:
		}
		vm.mu.Unlock()

		vm.stop.Store(false)
		for _, c := range vm.vcpus {
			c.run.SetImmediateExit(false)
			c.cmds <- func() { results <- c.loop() }
		}
		first := loopResult{kind: resStopped}
		got := 0
		select {
		case first = <-results:
			got = 1
		case <-ctx.Done():
		case <-vm.kick:
		}
		vm.stop.Store(true)
		vm.kickAll()
		for ; got < n; got++ {
			if r := <-results; first.kind == resStopped {
				first = r
			}
		}
		vm.mu.Lock()
		vm.running = false
		vm.cond.Broadcast()
		vm.mu.Unlock()

		if err := vm.userfaultErr(); err != nil {
			return err
		}
		switch first.kind {
		case resExit:
			vm.exited.Store(true)
			return nil
		case resFault:
			return first.err
		case resRequest:
			if err := vm.handleRequest(ctx, first.req); err != nil {
				return err
			}
		case resStopped:
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
}

func (vm *VM) handleRequest(ctx context.Context, req Request) error {
	c := vm.vcpus[req.VCPU]
	if vm.cfg.OnRequest == nil {
		return c.fault(ErrBadRequest, fmt.Sprintf("request %d with no handler", req.Kind))
	}
	var err error
	switch req.Kind {
	case RequestFork:
		if err = vm.family.admitFork(vm.depth, req.Arg); err == nil {
			defer vm.family.release(req.Arg)
		}
	case RequestSnapshot:
		err = vm.family.admitSnapshot(time.Now())
	}
	var v uint64
	if err == nil {
		v, err = vm.cfg.OnRequest(ctx, vm, req)
	}
	if errors.Is(err, ErrLimit) {
		if vm.cfg.OnRefused != nil {
			vm.cfg.OnRefused(vm, req, err)
		}
		return c.setRAX(RequestRefused)
	}
	if err != nil {
		return fmt.Errorf("vmm: guest request %d: %w", req.Kind, err)
	}
	return c.setRAX(v)
}

// userfaultErr returns the error that stopped the VM's page handler, if any.
func (vm *VM) userfaultErr() error {
	if vm.uffd != nil {
		if e := vm.uffd.err.Load(); e != nil {
			return *e
		}
	}
	return nil
}

func (c *VCPU) setRAX(v uint64) error {
	r, err := c.Regs()
	if err != nil {
		return err
	}
	r.RAX = v
	return c.SetRegs(r)
}

// loop runs on the vCPU's thread until the vCPU must stop.
func (c *VCPU) loop() (res loopResult) {
	defer func() {
		if res.kind != resFault {
			c.flush()
		}
	}()
	for {
		if c.vm.stop.Load() {
			return loopResult{kind: resStopped}
		}
		err := kvmapi.Run(c.fd)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return loopResult{kind: resFault, err: c.fault(ErrKVMInternal, "KVM_RUN: "+err.Error())}
		}
		if r, done := c.handleExit(); done {
			return r
		}
	}
}

// flush completes an instruction KVM left half done for us (an IN or OUT
// that exited to userspace) without entering the guest, so the captured
// state is after it.
func (c *VCPU) flush() {
	c.run.SetImmediateExit(true)
	kvmapi.Run(c.fd)
}

func (c *VCPU) fault(kind error, detail string) error {
	e := &GuestError{VCPU: c.id, Err: kind, Detail: detail}
	if r, err := kvmapi.GetRegs(uintptr(c.fd)); err == nil {
		e.RIP = r.RIP
	}
	return e
}

func (c *VCPU) handleExit() (loopResult, bool) {
	run := c.run
	switch reason := run.ExitReason(); reason {
	case kvmapi.ExitIO:
		io := run.IO()
		size, count := uint64(io.Size), uint64(io.Count)
		end := io.DataOffset + size*count
		if size == 0 || size > 8 || count == 0 || io.DataOffset > uint64(len(run)) || end > uint64(len(run)) || end < io.DataOffset {
			return loopResult{kind: resFault, err: c.fault(ErrBadExit, fmt.Sprintf("bad I/O exit: port %#x size %d count %d", io.Port, size, count))}, true
		}
		for i := range count {
			data := run[io.DataOffset+i*size : io.DataOffset+(i+1)*size]
			if r, done := c.vm.portIO(c, io.Port, io.Direction == kvmapi.IOOut, data); done {
				return r, true
			}
		}
	case kvmapi.ExitMMIO:
		m := run.MMIO()
		n := m.Len
		if n == 0 || n > 8 {
			return loopResult{kind: resFault, err: c.fault(ErrBadExit, fmt.Sprintf("bad MMIO exit: length %d", n))}, true
		}
		if !c.vm.mmio(m.PhysAddr, m.IsWrite != 0, m.Data[:n]) {
			dir := "read"
			if m.IsWrite != 0 {
				dir = "write"
			}
			return loopResult{kind: resFault, err: c.fault(ErrUnhandledMMIO, fmt.Sprintf("%d-byte %s at guest-physical %#x", n, dir, m.PhysAddr))}, true
		}
	case kvmapi.ExitHLT:
		return loopResult{kind: resFault, err: c.fault(ErrHalted, "")}, true
	case kvmapi.ExitShutdown:
		return loopResult{kind: resFault, err: c.fault(ErrTripleFault, "")}, true
	case kvmapi.ExitInternalError:
		in := run.Internal()
		return loopResult{kind: resFault, err: c.fault(ErrKVMInternal, fmt.Sprintf("suberror %d", in.Suberror))}, true
	case kvmapi.ExitFailEntry:
		return loopResult{kind: resFault, err: c.fault(ErrEntryFailed, fmt.Sprintf("hardware reason %#x", run.FailEntryReason()))}, true
	case kvmapi.ExitSystemEvent:
		c.vm.exitCode.Store(0)
		return loopResult{kind: resExit}, true
	case kvmapi.ExitIntr:
	default:
		return loopResult{kind: resFault, err: c.fault(ErrBadExit, fmt.Sprintf("exit reason %d", reason))}, true
	}
	return loopResult{}, false
}
