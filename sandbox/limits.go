package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"time"
)

// IsZero reports whether l sets no limit.
func (l Limits) IsZero() bool { return reflect.DeepEqual(l, Limits{}) }

// LimitsExt are the limits beyond pids and the project quota (see
// docs/policy.md). Zero means the default: no limit, except TmpfsBytes.
type LimitsExt struct {
	// CPUs is the CPU time per second the sandbox may use, in CPUs.
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryBytes bounds the sandbox's memory, its tmpfs files included;
	// over it the kernel kills a process of that sandbox only.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// IO throttles the block devices holding the host root and the state
	// root, in bytes and operations per second.
	IOReadBPS   int64 `json:"io_read_bps,omitempty"`
	IOWriteBPS  int64 `json:"io_write_bps,omitempty"`
	IOReadIOPS  int64 `json:"io_read_iops,omitempty"`
	IOWriteIOPS int64 `json:"io_write_iops,omitempty"`
	// TmpfsBytes bounds each of the sandbox's memory file systems (/tmp,
	// /run, /dev/shm); 0 takes DefaultTmpfsBytes. It is fixed at start.
	TmpfsBytes int64 `json:"tmpfs_bytes,omitempty"`
	// LayerBytes bounds the disk space of the sandbox's OS layer (what it
	// writes outside the project and its tmpfs); 0 takes
	// DefaultLayerBytes. It is checked every few seconds, not at each
	// write: a sandbox found over it is frozen (see docs/policy.md).
	LayerBytes int64 `json:"layer_bytes,omitempty"`
	// Devices are host device nodes (paths under /dev) passed through to
	// the sandbox at the same path, allowed by its device cgroup. Fixed
	// at start.
	Devices []string `json:"devices,omitempty"`
	// GPU passes the host's NVIDIA devices through (/dev/nvidia*) and
	// binds the driver's libraries and tools read-only. Fixed at start.
	GPU bool `json:"gpu,omitempty"`
	// Lifetime, when positive, removes the sandbox that long after it was
	// created.
	Lifetime time.Duration `json:"lifetime,omitempty"`
	// Idle, when positive, freezes a running sandbox that ran no command
	// and used no CPU for that long.
	Idle time.Duration `json:"idle,omitempty"`
}

// DefaultTmpfsBytes bounds each memory file system of a sandbox that sets
// no TmpfsBytes.
const DefaultTmpfsBytes = 512 << 20

// DefaultLayerBytes bounds the OS layer of a sandbox that sets no
// LayerBytes.
const DefaultLayerBytes = 10 << 30

// Check reports a limit out of range, naming it.
func (l Limits) Check() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"pids", l.Pids}, {"project_bytes", l.ProjectBytes}, {"memory_bytes", l.MemoryBytes},
		{"io_read_bps", l.IOReadBPS}, {"io_write_bps", l.IOWriteBPS}, {"io_read_iops", l.IOReadIOPS},
		{"io_write_iops", l.IOWriteIOPS}, {"tmpfs_bytes", l.TmpfsBytes}, {"layer_bytes", l.LayerBytes},
		{"lifetime", int64(l.Lifetime)}, {"idle", int64(l.Idle)}} {
		if f.v < 0 {
			return fmt.Errorf("limit %s: %d: want 0 (no limit) or more", f.name, f.v)
		}
	}
	if len(l.Devices) > 256 {
		return fmt.Errorf("limit devices: %d, more than 256", len(l.Devices))
	}
	for _, d := range l.Devices {
		if !strings.HasPrefix(d, "/dev/") || strings.Contains(d, "..") || strings.ContainsAny(d, ",:\\\n") {
			return fmt.Errorf("device %q: want a path under /dev", d)
		}
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("device %q: %w", d, err)
		}
		if st.Mode()&os.ModeDevice == 0 {
			return fmt.Errorf("device %q: not a device node", d)
		}
	}
	if l.GPU {
		if m, _ := filepath.Glob("/dev/nvidia*"); len(m) == 0 {
			return errors.New("gpu: this host has no /dev/nvidia* device (no NVIDIA GPU, or its driver is not loaded)")
		}
	}
	if l.CPUs < 0 || l.CPUs > 4096 {
		return fmt.Errorf("limit cpus: %g: want 0 (no limit) to 4096", l.CPUs)
	}
	if l.MemoryBytes > 0 && l.MemoryBytes < 8<<20 {
		return fmt.Errorf("limit memory_bytes: %d: want at least 8M (the agent needs some)", l.MemoryBytes)
	}
	if l.TmpfsBytes > 0 && l.TmpfsBytes < 1<<20 {
		return fmt.Errorf("limit tmpfs_bytes: %d: want at least 1M", l.TmpfsBytes)
	}
	return nil
}

// Usage is what a running sandbox uses now, from its cgroups.
type Usage struct {
	CPUNanos    uint64 `json:"cpu_ns"`
	MemoryBytes uint64 `json:"memory_bytes"`
	MemoryPeak  uint64 `json:"memory_peak_bytes,omitempty"`
	OOMKills    uint64 `json:"oom_kills"`
	Pids        uint64 `json:"pids"`
	// LayerBytes is the disk space of its OS layer when the manager last
	// measured it (every few seconds while it uses CPU, up to a little
	// past its bound); absent before the first measure.
	LayerBytes int64 `json:"layer_bytes,omitempty"`
}

// Limiter is an Instance whose limits change while it runs and whose use
// can be read.
type Limiter interface {
	SetLimits(l Limits) error
	Usage() (Usage, error)
	// LayerBytes returns the disk space its OS layer takes (an entry
	// counting one block at least), counting at most max bytes (a walk
	// stops there).
	LayerBytes(max int64) (int64, error)
}

// ErrBelowUsage reports a memory limit below what the sandbox uses now
// that the kernel could not reclaim down to.
var ErrBelowUsage = errors.New("below what the sandbox uses")

// UpdateLimits changes the limits of a sandbox: they are saved, and
// applied at once when it runs (TmpfsBytes only at its next start, and
// ProjectBytes to its branch). The change is audited.
func (m *Manager) UpdateLimits(ctx context.Context, name string, l Limits) (*Info, error) {
	return m.ChangeLimits(ctx, name, func(Limits) (Limits, error) { return l, nil })
}

// ChangeLimits changes the limits of a sandbox to what change returns for
// its current ones, as UpdateLimits does. Changes of limits are made one
// at a time, so change sees the limits it replaces; an error from change
// leaves them as they are and is returned as it is.
func (m *Manager) ChangeLimits(ctx context.Context, name string, change func(cur Limits) (Limits, error)) (*Info, error) {
	m.pol.limits.Lock()
	defer m.pol.limits.Unlock()
	info, err := m.Get(name)
	if err != nil {
		return nil, err
	}
	l, err := change(info.Limits)
	if err != nil {
		return nil, err
	}
	if err := l.Check(); err != nil {
		return nil, fmt.Errorf("update sandbox %q: %w", name, err)
	}
	if rt, err := m.runtimeOf(info); err == nil && !featuresOf(rt).Limits {
		if err := checkNoCgroupLimits(rt.Name(), l); err != nil {
			return nil, fmt.Errorf("update sandbox %q: %w", name, err)
		}
	}
	old := info.Limits
	if l.ProjectBytes != old.ProjectBytes {
		if err := m.fs.SetQuota(ctx, info.Branch, l.ProjectBytes); err != nil {
			return nil, fmt.Errorf("update sandbox %q: project quota: %w", name, err)
		}
	}
	if lv, err := m.running(name); err == nil {
		lim, ok := lv.inst.(Limiter)
		if !ok {
			return nil, fmt.Errorf("update sandbox %q: its runtime cannot change limits while it runs (stop it first)", name)
		}
		if err := lim.SetLimits(l); err != nil {
			// Put back what was there, so that the saved and applied agree.
			err = errors.Join(belowUsage(lim, l, err), lim.SetLimits(old))
			if l.ProjectBytes != old.ProjectBytes {
				err = errors.Join(err, m.fs.SetQuota(ctx, info.Branch, old.ProjectBytes))
			}
			return nil, fmt.Errorf("update sandbox %q: %w", name, err)
		}
	}
	info.Limits = l
	if err := m.save(info); err != nil {
		return nil, err
	}
	m.audit(name, "limits", map[string]any{"old": old, "new": l})
	return info, nil
}

// belowUsage names the cause when the kernel refused a memory limit
// (EBUSY: it could not reclaim down to it), wrapping ErrBelowUsage.
func belowUsage(lim Limiter, l Limits, err error) error {
	if !errors.Is(err, syscall.EBUSY) || l.MemoryBytes == 0 {
		return err
	}
	use := "more"
	if u, uerr := lim.Usage(); uerr == nil {
		use = fmt.Sprintf("%d bytes", u.MemoryBytes)
	}
	return fmt.Errorf("memory limit %d bytes is %w (%s) and the kernel could not reclaim enough; free memory in it (files in its /tmp, /run and /dev/shm count) or give a higher limit: %v",
		l.MemoryBytes, ErrBelowUsage, use, err)
}

// Usage returns what a running sandbox uses now.
func (m *Manager) Usage(name string) (*Usage, error) {
	lv, err := m.running(name)
	if err != nil {
		return nil, err
	}
	lim, ok := lv.inst.(Limiter)
	if !ok {
		return nil, fmt.Errorf("sandbox %q: its runtime reports no usage", name)
	}
	u, err := lim.Usage()
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", name, err)
	}
	m.pol.mu.Lock()
	if w := m.pol.watch[name]; w != nil && w.layer >= 0 {
		u.LayerBytes = w.layer
	}
	m.pol.mu.Unlock()
	return &u, nil
}

// ProjectBytes returns the bytes charged to a sandbox's project branch,
// read from the store: its agent is not asked, so it answers for a
// frozen or stopped sandbox too.
func (m *Manager) ProjectBytes(ctx context.Context, name string) (int64, error) {
	info, err := m.Get(name)
	if err != nil {
		return 0, err
	}
	used, _, err := m.fs.BranchUsage(ctx, info.Branch)
	if err != nil {
		return 0, fmt.Errorf("sandbox %q: project bytes: %w", name, err)
	}
	return used, nil
}
