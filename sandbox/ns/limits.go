package ns

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"

	"golang.org/x/sys/unix"

	"tine/sandbox"
	"tine/sandbox/internal/cgroup"
)

// cgroupLimits turns a sandbox's limits into its cgroup's. IO limits
// apply to the disks holding the host root (the lower layer) and dir
// (the sandbox's own layer).
func cgroupLimits(l sandbox.Limits, dir string) (cgroup.Limits, error) {
	cl := cgroup.Limits{Pids: l.Pids, MemoryBytes: l.MemoryBytes, CPUs: l.CPUs}
	pt, err := devicesFor(l)
	if err != nil {
		return cl, err
	}
	cl.Devices = pt.rules
	// The devices are listed with zero throttles too, which removes
	// those set before (tine update).
	none := l.IOReadBPS == 0 && l.IOWriteBPS == 0 && l.IOReadIOPS == 0 && l.IOWriteIOPS == 0
	seen := map[[2]uint32]bool{}
	for _, p := range []string{"/", dir} {
		maj, min, err := cgroup.BlockDevice(p)
		if err != nil && none {
			continue // nothing to throttle, nothing set before
		}
		if err != nil {
			return cl, err
		}
		if seen[[2]uint32{maj, min}] {
			continue
		}
		seen[[2]uint32{maj, min}] = true
		cl.IO = append(cl.IO, cgroup.IOLimit{Major: maj, Minor: min, ReadBPS: l.IOReadBPS,
			WriteBPS: l.IOWriteBPS, ReadIOPS: l.IOReadIOPS, WriteIOPS: l.IOWriteIOPS})
	}
	return cl, nil
}

// applyLimits sets the cgroup's limits for l, unless they are the ones
// it set last: a warm instance has the default ones set while it waits,
// and writing a dozen cgroup files again cost a create about 1 ms.
func (in *instance) applyLimits(l sandbox.Limits, dir string) error {
	cl, err := cgroupLimits(l, dir)
	if err != nil {
		return err
	}
	if in.limits != nil && reflect.DeepEqual(*in.limits, cl) {
		return nil
	}
	g, ok := in.cg.(*cgroup.Group)
	if !ok {
		// Rootless mode: no cgroups (group.go).
		if l.MemoryBytes != 0 || l.CPUs != 0 || len(cl.IO) > 0 && (l.IOReadBPS|l.IOWriteBPS|l.IOReadIOPS|l.IOWriteIOPS) != 0 || len(l.Devices) > 0 || l.GPU {
			return fmt.Errorf("sandbox %s: cpu, memory, io and device limits need cgroups, which rootless mode does not have here: run tine as root, or go without them", in.id)
		}
		return nil
	}
	in.limits = nil
	if err := g.Set(cl); err != nil {
		return fmt.Errorf("sandbox %s: %w", in.id, err)
	}
	in.limits = &cl
	return nil
}

// SetLimits changes the running sandbox's cgroup limits.
func (in *instance) SetLimits(l sandbox.Limits) error { return in.applyLimits(l, in.dir) }

// Usage reads the sandbox's cgroup counters.
func (in *instance) Usage() (sandbox.Usage, error) {
	g, ok := in.cg.(*cgroup.Group)
	if !ok {
		return sandbox.Usage{}, fmt.Errorf("sandbox %s: rootless mode has no cgroups to read its use from", in.id)
	}
	s, err := g.Stats()
	return sandbox.Usage{CPUNanos: s.CPUNanos, MemoryBytes: s.MemoryBytes, MemoryPeak: s.MemoryPeak,
		OOMKills: s.OOMKills, Pids: s.Pids}, err
}

// OOMKills reads how many tasks of the sandbox the kernel's OOM killer
// has killed (sandbox.OOMCounter).
func (in *instance) OOMKills() (uint64, error) {
	g, ok := in.cg.(*cgroup.Group)
	if !ok {
		return 0, fmt.Errorf("sandbox %s: rootless mode has no cgroups to count OOM kills in", in.id)
	}
	return g.OOMKills()
}

// LayerBytes sums the disk blocks of the sandbox's upper layer, each
// entry counted as one block at least (minEntryBytes), stopping once the
// sum passes bound. The sandbox runs meanwhile; the walk never follows a
// symlink it swaps in for a directory (walkLayerAt).
func (in *instance) LayerBytes(bound int64) (int64, error) {
	upper := filepath.Join(in.dir, upperDir)
	var n int64
	var st unix.Stat_t
	if err := unix.Lstat(upper, &st); err != nil {
		return 0, err
	}
	n = st.Blocks * 512 // the layer's own directory, as an empty layer's
	stop := errors.New("over")
	err := walkLayerAt(context.Background(), upper, func(_ int, _ string, st *unix.Stat_t) error {
		if n += max(st.Blocks*512, minEntryBytes); n > bound {
			return stop
		}
		return nil
	})
	if err != nil && err != stop {
		return n, err
	}
	return n, nil
}

// minEntryBytes is what an entry of the OS layer counts against its
// bound at least: an empty file, a symlink or a device takes no block
// but an inode of the host's file system, and a layer of millions of
// them would use up the host's inodes within any bound in bytes. A
// block a file is what a layer of small files counts anyway.
const minEntryBytes = 4096
