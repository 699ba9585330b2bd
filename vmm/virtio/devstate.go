package virtio

// MaxDeviceState bounds the state one device carries in a fork or a saved
// machine image.
const MaxDeviceState = 64 << 20

// StatefulDevice is a Device with host-side state that the guest's memory
// refers to, so that a clone must start with it (the virtio-fs device: the
// node ids and file handles its guest holds). The machine takes it with
// its transports held and the VM paused, and gives it to the clone's
// device of the same type before the clone runs.
type StatefulDevice interface {
	Device
	// SaveState returns the device's state, at most MaxDeviceState
	// bytes; nil when there is none. Transport lock (Transport.Hold).
	SaveState() ([]byte, error)
	// RestoreState loads what SaveState returned (never empty) into
	// the device of a clone, after Transport.SetState and before the
	// clone runs. An error fails the clone.
	RestoreState(t *Transport, state []byte) error
}
