package vmm

// Image is a sealed, immutable guest memory image with the machine state
// captured with it.
type Image struct {
	memfd int
	size  uint64
	state *State
}

// State is a VM's complete CPU and device state.
type State struct{}
