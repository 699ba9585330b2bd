package vm

import (
	"fmt"
	"slices"
	"time"

	"tine/guestagent/proto"
	"tine/sandbox"
	"tine/vmm/linux"
	"tine/vmm/virtio"
)

// ShareTag is the virtio-fs tag of the project share.
const ShareTag = "tine-project"

// shareQuiesce bounds how long a fork waits for the project share's
// server to answer the requests in flight.
const shareQuiesce = 2 * time.Second

// addShare makes the sandbox's virtio-fs device: it serves
// spec.ProjectSource (the sandbox's cowfs branch), and the hygiene
// request of every Start has the guest agent mount it at
// spec.ProjectPath. Every machine has the device, so that images keep one
// device list; without a project it answers the guest's mount ENODEV. A
// clone of an image saved before machines had it gets none (in.share
// stays nil), since a clone's devices are its image's.
func (in *Instance) addShare(spec sandbox.Spec, img *linux.MachineImage) error {
	if img != nil && !slices.Contains(img.DeviceTypes(), virtio.TypeFS) {
		return nil
	}
	in.share = &virtio.FS{Tag: ShareTag}
	if spec.ProjectSource == "" || spec.ProjectPath == "" {
		return nil
	}
	m := &proto.ShareMount{Tag: ShareTag, Path: spec.ProjectPath}
	if err := m.Check(); err != nil {
		return fmt.Errorf("vm runtime: project path: %w", err)
	}
	in.share.Connect = virtio.LoopbackServer(spec.ProjectSource)
	in.mount = m
	return nil
}

// shareTransport is the transport of the share device, or nil.
func (in *Instance) shareTransport() *virtio.Transport {
	if in.m == nil || in.share == nil {
		return nil
	}
	for _, t := range in.m.Virtio {
		if t.Device() == virtio.Device(in.share) {
			return t
		}
	}
	return nil
}

// quiesceShare waits (vCPUs paused) for the share's server to answer the
// requests in flight: the memory a fork takes then has no request that
// the clone's device would never answer (a request still unanswered
// keeps the device from carrying its session into the clone), and a
// snapshot of the branch holds every write the guest made.
func (in *Instance) quiesceShare() {
	if t := in.shareTransport(); t != nil {
		in.share.WaitIdle(t, shareQuiesce)
	}
}

// kickShare processes the share's queues once: in a clone, requests the
// guest queued before the fork, which no notification will announce
// again, get their answer: from the clone's server when the device
// carried its parent's session over, else EIO (until the guest mounts
// again), so that the remount does not wait for them.
func (in *Instance) kickShare() {
	if t := in.shareTransport(); t != nil {
		for q := range in.share.QueueMax() {
			t.Kick(q)
		}
	}
}

// closeShare ends the share's session (its server process exits).
func (in *Instance) closeShare() {
	if t := in.shareTransport(); t != nil {
		in.share.Close(t)
	}
}
