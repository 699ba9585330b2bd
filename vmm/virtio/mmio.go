package virtio

import (
	"errors"
	"fmt"
	"sync"
)

// virtio-mmio version 2 register offsets.
const (
	RegMagic          = 0x000
	RegVersion        = 0x004
	RegDeviceID       = 0x008
	RegVendorID       = 0x00c
	RegDeviceFeatures = 0x010
	RegDeviceFeatSel  = 0x014
	RegDriverFeatures = 0x020
	RegDriverFeatSel  = 0x024
	RegQueueSel       = 0x030
	RegQueueNumMax    = 0x034
	RegQueueNum       = 0x038
	RegQueueReady     = 0x044
	RegQueueNotify    = 0x050
	RegInterruptStat  = 0x060
	RegInterruptACK   = 0x064
	RegStatus         = 0x070
	RegQueueDescLow   = 0x080
	RegQueueDescHigh  = 0x084
	RegQueueAvailLow  = 0x090
	RegQueueAvailHigh = 0x094
	RegQueueUsedLow   = 0x0a0
	RegQueueUsedHigh  = 0x0a4
	RegShmSel         = 0x0ac
	RegShmLenLow      = 0x0b0
	RegShmLenHigh     = 0x0b4
	RegShmBaseLow     = 0x0b8
	RegShmBaseHigh    = 0x0bc
	RegConfigGen      = 0x0fc
	RegConfig         = 0x100

	// WindowSize is the guest-physical size of one device's registers.
	WindowSize = 0x200

	magicValue = 0x74726976 // "virt"
	vendorID   = 0x656e6974 // "tine"
)

// Device status bits.
const (
	StatusAcknowledge = 1
	StatusDriver      = 2
	StatusDriverOK    = 4
	StatusFeaturesOK  = 8
	StatusNeedsReset  = 64
	StatusFailed      = 128
)

// Interrupt status bits.
const (
	IntUsedBuffer   = 1
	IntConfigChange = 2
)

// FeatureVersion1 (VIRTIO_F_VERSION_1) is offered by every device: the
// modern interface is the only one.
const FeatureVersion1 = 1 << 32

// Device types.
const (
	TypeBlock   = 2
	TypeConsole = 3
	TypeRNG     = 4
	TypeVsock   = 19
)

// Device is one virtio device behind a Transport. Its methods are called
// with the transport's lock held, from vCPU threads, notification
// goroutines or the device's own host-side goroutines (through
// Transport.Do).
type Device interface {
	// Type is the virtio device type.
	Type() uint32
	// Features are the device-specific feature bits it offers.
	Features() uint64
	// QueueMax gives, per queue, the largest size the device accepts.
	QueueMax() []uint16
	// ReadConfig fills data from the device configuration space at off.
	ReadConfig(off uint64, data []byte)
	// WriteConfig receives a driver's write to the configuration space.
	WriteConfig(off uint64, data []byte)
	// Notify processes queue q after the driver added buffers to it.
	// An error wrapping ErrBadGuest (or any other) stops the device
	// until the driver resets it.
	Notify(t *Transport, q int) error
	// Reset drops the device's per-driver state (the driver wrote 0 to
	// the status register, or the transport failed).
	Reset()
}

// Transport is a virtio-mmio (version 2) register window in front of a
// Device. It implements vmm.MMIODevice given the window's base address.
type Transport struct {
	mu   sync.Mutex
	base uint64
	mem  Memory
	dev  Device
	irq  func()

	status, intStatus      uint32
	devFeatSel, drvFeatSel uint32
	driverFeatures         uint64
	queueSel               uint32
	queues                 []Queue
	configGen              uint32
	err                    error
}

// NewTransport puts dev behind a register window at guest-physical base,
// over guest RAM mem. interrupt raises the device's interrupt line (an
// edge); it may be called with the transport's lock held.
func NewTransport(base uint64, mem Memory, dev Device, interrupt func()) *Transport {
	t := &Transport{base: base, mem: mem, dev: dev, irq: interrupt}
	for _, m := range dev.QueueMax() {
		t.queues = append(t.queues, Queue{Max: m})
	}
	return t
}

// Base is the guest-physical address of the register window.
func (t *Transport) Base() uint64 { return t.base }

// Device returns the device behind the transport.
func (t *Transport) Device() Device { return t.dev }

// Mem is guest RAM.
func (t *Transport) Mem() Memory { return t.mem }

// SetMem replaces guest RAM (after a fork maps the child's memory).
func (t *Transport) SetMem(mem Memory) {
	t.mu.Lock()
	t.mem = mem
	t.mu.Unlock()
}

// Queue returns queue i; call it only from Device methods (the lock is
// held).
func (t *Transport) Queue(i int) *Queue { return &t.queues[i] }

// Ready reports whether the driver finished setting up the device.
func (t *Transport) Ready() bool {
	return t.status&StatusDriverOK != 0 && t.status&StatusNeedsReset == 0
}

// Err is the error that stopped the device, or nil.
func (t *Transport) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Negotiated reports whether the driver accepted feature bit f.
func (t *Transport) Negotiated(f uint64) bool { return t.driverFeatures&f != 0 }

// Used returns chain head to queue q with n bytes written and raises the
// interrupt unless the driver suppressed it. Device methods only.
func (t *Transport) Used(q int, head uint16, n uint32) error {
	qu := &t.queues[q]
	if err := qu.Push(t.mem, head, n); err != nil {
		return err
	}
	if qu.NeedsInterrupt(t.mem) {
		t.intStatus |= IntUsedBuffer
		if t.irq != nil {
			t.irq()
		}
	}
	return nil
}

// Do runs f with the transport's lock held, for host-side work (input
// that arrived, a connection that closed). f's error stops the device as
// a Notify error does. Nothing runs while the device is not ready.
func (t *Transport) Do(f func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.Ready() {
		return nil
	}
	if err := f(); err != nil {
		t.fail(err)
		return err
	}
	return nil
}

// Kick processes queue q as if the driver had notified it (the ioeventfd
// path calls it).
func (t *Transport) Kick(q int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.notify(q)
}

func (t *Transport) notify(q int) {
	if !t.Ready() || q < 0 || q >= len(t.queues) || !t.queues[q].Ready {
		return
	}
	if err := t.dev.Notify(t, q); err != nil {
		t.fail(fmt.Errorf("queue %d: %w", q, err))
	}
}

// fail stops the device: DEVICE_NEEDS_RESET and a configuration-change
// interrupt, as the virtio spec asks.
func (t *Transport) fail(err error) {
	if t.err == nil {
		t.err = fmt.Errorf("virtio device type %d at %#x: %w", t.dev.Type(), t.base, err)
	}
	t.status |= StatusNeedsReset
	t.intStatus |= IntConfigChange
	if t.irq != nil {
		t.irq()
	}
}

func (t *Transport) reset() {
	t.status, t.intStatus, t.driverFeatures = 0, 0, 0
	t.devFeatSel, t.drvFeatSel, t.queueSel = 0, 0, 0
	t.err = nil
	for i := range t.queues {
		t.queues[i].Reset()
	}
	t.dev.Reset()
}

func (t *Transport) features() uint64 { return t.dev.Features() | FeatureVersion1 }

// Read implements vmm.MMIODevice.
func (t *Transport) Read(addr uint64, data []byte) {
	clear(data)
	off := addr - t.base
	t.mu.Lock()
	defer t.mu.Unlock()
	if off >= RegConfig {
		t.dev.ReadConfig(off-RegConfig, data)
		return
	}
	if len(data) != 4 || off%4 != 0 {
		return
	}
	var v uint32
	q := t.selected()
	switch off {
	case RegMagic:
		v = magicValue
	case RegVersion:
		v = 2
	case RegDeviceID:
		v = t.dev.Type()
	case RegVendorID:
		v = vendorID
	case RegDeviceFeatures:
		if t.devFeatSel < 2 {
			v = uint32(t.features() >> (32 * t.devFeatSel))
		}
	case RegQueueNumMax:
		if q != nil {
			v = uint32(q.Max)
		}
	case RegQueueReady:
		if q != nil && q.Ready {
			v = 1
		}
	case RegInterruptStat:
		v = t.intStatus
	case RegStatus:
		v = t.status
	case RegConfigGen:
		v = t.configGen
	case RegShmLenLow, RegShmLenHigh, RegShmBaseLow, RegShmBaseHigh:
		// No shared memory regions: all ones, as the spec says for a
		// region that does not exist (virtio-fs asks for its DAX
		// window, and a zero answer would be a region of 0 bytes).
		v = 0xffffffff
	}
	le.PutUint32(data, v)
}

func (t *Transport) selected() *Queue {
	if t.queueSel < uint32(len(t.queues)) {
		return &t.queues[t.queueSel]
	}
	return nil
}

// Write implements vmm.MMIODevice.
func (t *Transport) Write(addr uint64, data []byte) {
	off := addr - t.base
	t.mu.Lock()
	defer t.mu.Unlock()
	if off >= RegConfig {
		t.dev.WriteConfig(off-RegConfig, data)
		return
	}
	if len(data) != 4 || off%4 != 0 {
		return
	}
	v := le.Uint32(data)
	q := t.selected()
	// Queue setup is only accepted while the queue is not live.
	setup := q != nil && !q.Ready && t.status&StatusDriverOK == 0
	switch off {
	case RegDeviceFeatSel:
		t.devFeatSel = v
	case RegDriverFeatSel:
		t.drvFeatSel = v
	case RegDriverFeatures:
		if t.drvFeatSel < 2 && t.status&StatusFeaturesOK == 0 {
			shift := 32 * t.drvFeatSel
			t.driverFeatures = t.driverFeatures&^(0xffffffff<<shift) | uint64(v)<<shift
		}
	case RegQueueSel:
		t.queueSel = v
	case RegQueueNum:
		if setup {
			q.Size = uint16(min(v, 0xffff))
		}
	case RegQueueReady:
		if q == nil {
			return
		}
		if v == 1 && setup {
			if err := q.check(t.mem); err != nil {
				t.fail(fmt.Errorf("queue %d: %w", t.queueSel, err))
				return
			}
			q.Ready = true
		} else if v == 0 {
			q.Ready = false
		}
	case RegQueueNotify:
		t.notify(int(v & 0xffff))
	case RegInterruptACK:
		t.intStatus &^= v
	case RegStatus:
		t.writeStatus(v)
	case RegQueueDescLow, RegQueueDescHigh, RegQueueAvailLow, RegQueueAvailHigh, RegQueueUsedLow, RegQueueUsedHigh:
		if !setup {
			return
		}
		var p *uint64
		switch off &^ 4 {
		case RegQueueDescLow:
			p = &q.Desc
		case RegQueueAvailLow:
			p = &q.Avail
		default:
			p = &q.Used
		}
		if off&4 == 0 {
			*p = *p&^0xffffffff | uint64(v)
		} else {
			*p = *p&0xffffffff | uint64(v)<<32
		}
	}
}

func (t *Transport) writeStatus(v uint32) {
	if v == 0 {
		t.reset()
		return
	}
	v &= 0xff
	if v&StatusFeaturesOK != 0 && t.status&StatusFeaturesOK == 0 {
		// Refuse features the device did not offer, and a driver that
		// did not accept VERSION_1.
		if t.driverFeatures&^t.features() != 0 || t.driverFeatures&FeatureVersion1 == 0 {
			v &^= StatusFeaturesOK
		}
	}
	t.status = v | t.status&StatusNeedsReset
	if v&StatusFailed != 0 {
		t.err = errors.Join(t.err, fmt.Errorf("the driver set FAILED"))
	}
}

// State is a transport's driver-visible state, carried into a fork or a
// restored VM so that the guest's driver finds its device as it left it.
type State struct {
	Status, IntStatus      uint32
	DevFeatSel, DrvFeatSel uint32
	DriverFeatures         uint64
	QueueSel               uint32
	ConfigGen              uint32
	Queues                 []Queue
}

// State returns the transport's state; take it while the VM is paused.
func (t *Transport) State() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state()
}

// Hold locks the transport and returns its state and the function that
// unlocks it. While it is held no device work runs (a host-side Do, such
// as a frame arriving for the guest, waits), so guest memory sealed then
// matches the state: take it while the VM is paused.
func (t *Transport) Hold() (State, func()) {
	t.mu.Lock()
	return t.state(), t.mu.Unlock
}

func (t *Transport) state() State {
	return State{Status: t.status, IntStatus: t.intStatus, DevFeatSel: t.devFeatSel, DrvFeatSel: t.drvFeatSel,
		DriverFeatures: t.driverFeatures, QueueSel: t.queueSel, ConfigGen: t.configGen,
		Queues: append([]Queue(nil), t.queues...)}
}

// SetState loads a state taken from another transport of the same
// device type. Queue geometry is checked again when the queues are used.
func (t *Transport) SetState(s State) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(s.Queues) != len(t.queues) {
		return fmt.Errorf("virtio: state has %d queues, device type %d has %d", len(s.Queues), t.dev.Type(), len(t.queues))
	}
	t.status, t.intStatus, t.devFeatSel, t.drvFeatSel = s.Status, s.IntStatus, s.DevFeatSel, s.DrvFeatSel
	t.driverFeatures, t.queueSel, t.configGen = s.DriverFeatures, s.QueueSel, s.ConfigGen
	for i, q := range s.Queues {
		q.Max = t.queues[i].Max
		t.queues[i] = q
	}
	return nil
}

// ConfigChanged bumps the configuration generation and raises a
// configuration-change interrupt. Device methods only.
func (t *Transport) ConfigChanged() {
	t.configGen++
	t.intStatus |= IntConfigChange
	if t.irq != nil {
		t.irq()
	}
}
