package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// v1Controllers are the v1 hierarchies a group is made in, when mounted:
// pids first and freezer last (see Group.dirs).
var v1Controllers = []string{"pids", "memory", "cpu", "cpuacct", "blkio", "devices", "freezer"}

// v1Dirs lists the group's directory in each v1 hierarchy the host has;
// pids and freezer are always listed (New fails without them).
func v1Dirs(name string) []string {
	var dirs []string
	for _, c := range v1Controllers {
		root := filepath.Join(Root, c)
		if c != "pids" && c != "freezer" {
			if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
				continue
			}
		}
		dirs = append(dirs, filepath.Join(root, parent, name))
	}
	return dirs
}

// enableV2 turns on, for the children of top, every controller a sandbox
// group uses that the host offers.
func enableV2(top string) error {
	b, _ := os.ReadFile(filepath.Join(top, "cgroup.controllers"))
	have := strings.Fields(string(b))
	var on []string
	for _, c := range []string{"pids", "memory", "cpu", "io"} {
		for _, h := range have {
			if h == c {
				on = append(on, "+"+c)
			}
		}
	}
	if len(on) == 0 {
		on = []string{"+pids"}
	}
	ctl := filepath.Join(top, "cgroup.subtree_control")
	if err := os.WriteFile(ctl, []byte(strings.Join(on, " ")), 0); err != nil {
		// One at a time: a controller the host will not delegate here
		// leaves its limits unenforced (Set then fails naming it), the
		// others still work; pids is required.
		for _, c := range on {
			if werr := os.WriteFile(ctl, []byte(c), 0); werr != nil && c == "+pids" {
				return fmt.Errorf("cgroup: enable the pids controller in %s: %w", top, werr)
			}
		}
	}
	return nil
}

// Limits are what Set applies to a group. Zero means no limit.
type Limits struct {
	Pids int64
	// MemoryBytes bounds the group's memory (its tmpfs pages included),
	// and memory plus swap to the same number where swap is accounted.
	MemoryBytes int64
	// CPUs is the CPU time per wall-clock second the group may use, in
	// CPUs (1.5: one and a half).
	CPUs float64
	// IO are throttles per block device.
	IO []IOLimit
	// Devices, when not nil, are the only device nodes the group's tasks
	// may open or create (v1 devices controller). v2 needs a BPF program
	// for this, which is not built: there Devices is not enforced and
	// DevicesEnforced reports false.
	Devices []DeviceRule
}

// DeviceRule allows one device, or a range: Minor -1 is every minor.
type DeviceRule struct {
	Type         byte // 'c' or 'b'
	Major, Minor int64
}

func (r DeviceRule) String() string {
	mi := "*"
	if r.Minor >= 0 {
		mi = strconv.FormatInt(r.Minor, 10)
	}
	return fmt.Sprintf("%c %d:%s rwm", r.Type, r.Major, mi)
}

// DevicesEnforced reports whether this host's cgroups enforce Devices.
func DevicesEnforced() bool {
	if V2() {
		return false
	}
	_, err := os.Stat(filepath.Join(Root, "devices", "devices.allow"))
	return err == nil
}

// setDevices replaces the group's device allow-list with rules.
func (g *Group) setDevices(rules []DeviceRule) error {
	if rules == nil || g.v2 || g.dir("devices") == "" {
		return nil
	}
	if err := g.write("devices", "devices.deny", "a"); err != nil {
		return err
	}
	for _, r := range rules {
		if err := g.write("devices", "devices.allow", r.String()); err != nil {
			return err
		}
	}
	return nil
}

// IOLimit throttles one block device; zero fields do not throttle.
type IOLimit struct {
	Major, Minor                           uint32
	ReadBPS, WriteBPS, ReadIOPS, WriteIOPS int64
}

// cfsPeriod is the CPU bandwidth period, in microseconds.
const cfsPeriod = 100000

// dir returns the group's directory of v1 controller c, or its one v2
// directory; "" when the host has no such v1 hierarchy.
func (g *Group) dir(c string) string {
	if g.v2 {
		return g.dirs[0]
	}
	for _, d := range g.dirs {
		if filepath.Base(filepath.Dir(filepath.Dir(d))) == c {
			return d
		}
	}
	return ""
}

func (g *Group) write(c, file, val string) error {
	d := g.dir(c)
	if d == "" {
		return fmt.Errorf("cgroup: this host has no %s controller for %s", c, file)
	}
	p := filepath.Join(d, file)
	if err := os.WriteFile(p, []byte(val), 0); err != nil {
		return fmt.Errorf("cgroup: write %q to %s: %w", val, p, err)
	}
	return nil
}

// Set applies l to the group, running or not: a zero field removes that
// limit. Memory below what the group uses now is refused by the kernel
// when it cannot reclaim enough (the error says so).
func (g *Group) Set(l Limits) error {
	if l.Pids < 0 || l.MemoryBytes < 0 || l.CPUs < 0 {
		return errors.New("cgroup: limits must be 0 (no limit) or more")
	}
	errs := []error{g.SetPidsMax(l.Pids), g.setMemory(l.MemoryBytes), g.setCPU(l.CPUs), g.setDevices(l.Devices)}
	errs = append(errs, g.setIO(l.IO)...)
	return errors.Join(errs...)
}

// v2Missing reports a v2 interface file the group lacks (its controller
// not enabled here).
func (g *Group) v2Missing(file string) bool {
	_, err := os.Stat(filepath.Join(g.dirs[0], file))
	return g.v2 && err != nil
}

func (g *Group) setMemory(n int64) error {
	if g.v2 && n == 0 && g.v2Missing("memory.max") {
		return nil
	}
	if g.v2 {
		v := "max"
		if n > 0 {
			v = strconv.FormatInt(n, 10)
		}
		err := g.write("memory", "memory.max", v)
		if _, serr := os.Stat(filepath.Join(g.dirs[0], "memory.swap.max")); serr == nil {
			sv := "max"
			if n > 0 {
				sv = "0"
			}
			err = errors.Join(err, g.write("memory", "memory.swap.max", sv))
		}
		return err
	}
	v := "-1"
	if n > 0 {
		v = strconv.FormatInt(n, 10)
	}
	d := g.dir("memory")
	if d == "" {
		if n == 0 {
			return nil
		}
		return errors.New("cgroup: this host has no memory controller")
	}
	// memory.memsw.limit_in_bytes (when swap is accounted) must stay at or
	// above memory.limit_in_bytes: the order of the two writes depends on
	// whether the limit rises or falls.
	memsw := filepath.Join(d, "memory.memsw.limit_in_bytes")
	if _, err := os.Stat(memsw); err != nil {
		return g.write("memory", "memory.limit_in_bytes", v)
	}
	if err := g.write("memory", "memory.limit_in_bytes", v); err != nil {
		if err2 := g.write("memory", "memory.memsw.limit_in_bytes", v); err2 != nil {
			return errors.Join(err, err2)
		}
		return g.write("memory", "memory.limit_in_bytes", v)
	}
	return g.write("memory", "memory.memsw.limit_in_bytes", v)
}

func (g *Group) setCPU(cpus float64) error {
	quota := int64(-1)
	if cpus > 0 {
		quota = max(int64(cpus*cfsPeriod), 1000)
	}
	if g.v2 && quota < 0 && g.v2Missing("cpu.max") {
		return nil
	}
	if g.v2 {
		v := "max " + strconv.Itoa(cfsPeriod)
		if quota > 0 {
			v = fmt.Sprintf("%d %d", quota, cfsPeriod)
		}
		return g.write("cpu", "cpu.max", v)
	}
	if g.dir("cpu") == "" {
		if cpus == 0 {
			return nil
		}
		return errors.New("cgroup: this host has no cpu controller")
	}
	if err := g.write("cpu", "cpu.cfs_period_us", strconv.Itoa(cfsPeriod)); err != nil {
		return err
	}
	return g.write("cpu", "cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
}

// setIO writes each device's throttles; a device whose fields are all
// zero has its throttles removed.
func (g *Group) setIO(io []IOLimit) []error {
	var errs []error
	for _, l := range io {
		dev := fmt.Sprintf("%d:%d", l.Major, l.Minor)
		if g.v2 {
			f := func(n int64) string {
				if n <= 0 {
					return "max"
				}
				return strconv.FormatInt(n, 10)
			}
			errs = append(errs, g.write("io", "io.max", fmt.Sprintf("%s rbps=%s wbps=%s riops=%s wiops=%s",
				dev, f(l.ReadBPS), f(l.WriteBPS), f(l.ReadIOPS), f(l.WriteIOPS))))
			continue
		}
		for _, w := range []struct {
			file string
			n    int64
		}{{"blkio.throttle.read_bps_device", l.ReadBPS}, {"blkio.throttle.write_bps_device", l.WriteBPS},
			{"blkio.throttle.read_iops_device", l.ReadIOPS}, {"blkio.throttle.write_iops_device", l.WriteIOPS}} {
			errs = append(errs, g.write("blkio", w.file, fmt.Sprintf("%s %d", dev, max(w.n, 0))))
		}
	}
	return errs
}

// Stats is what the group has used.
type Stats struct {
	// CPUNanos is the CPU time its tasks used, in nanoseconds.
	CPUNanos uint64 `json:"cpu_ns"`
	// MemoryBytes is its memory use now; MemoryPeak the most so far
	// (v2 hosts without memory.peak report 0).
	MemoryBytes uint64 `json:"memory_bytes"`
	MemoryPeak  uint64 `json:"memory_peak_bytes,omitempty"`
	// OOMKills counts the tasks the kernel killed because the group was
	// over its memory limit.
	OOMKills uint64 `json:"oom_kills"`
	// Pids is the number of tasks in it.
	Pids uint64 `json:"pids"`
}

// Stats reads what the group has used. Counters a host lacks read 0.
func (g *Group) Stats() (Stats, error) {
	var s Stats
	read := func(c, file string) string {
		d := g.dir(c)
		if d == "" {
			return ""
		}
		b, _ := os.ReadFile(filepath.Join(d, file))
		return string(b)
	}
	num := func(v string) uint64 {
		n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		return n
	}
	key := func(v, k string) uint64 {
		for _, line := range strings.Split(v, "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == k {
				return num(f[1])
			}
		}
		return 0
	}
	if g.v2 {
		s.CPUNanos = key(read("cpu", "cpu.stat"), "usage_usec") * 1000
		s.MemoryBytes = num(read("memory", "memory.current"))
		s.MemoryPeak = num(read("memory", "memory.peak"))
		s.OOMKills = key(read("memory", "memory.events"), "oom_kill")
		s.Pids = num(read("pids", "pids.current"))
	} else {
		s.CPUNanos = num(read("cpuacct", "cpuacct.usage"))
		s.MemoryBytes = num(read("memory", "memory.usage_in_bytes"))
		s.MemoryPeak = num(read("memory", "memory.max_usage_in_bytes"))
		s.OOMKills = key(read("memory", "memory.oom_control"), "oom_kill")
		s.Pids = num(read("pids", "pids.current"))
	}
	if _, err := os.Stat(g.dirs[0]); err != nil {
		return s, fmt.Errorf("cgroup: %w", err)
	}
	return s, nil
}

// OOMKills reads the one counter of Stats that exec needs at each start
// and end: the tasks the kernel's OOM killer killed in the group (v2
// memory.events, v1 memory.oom_control; the kernel counts a kill before
// it sends the SIGKILL). A host without the counter reads 0.
func (g *Group) OOMKills() (uint64, error) {
	d := g.dir("memory")
	if d == "" {
		return 0, errors.New("cgroup: this host has no memory controller")
	}
	file := "memory.oom_control"
	if g.v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(d, file))
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, nil
}

// BlockDevice returns the whole disk (major, minor) holding the file
// system of path, for IO limits: a partition is throttled through its
// disk.
func BlockDevice(path string) (major, minor uint32, err error) {
	var st unixStat
	if err := stat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("cgroup: the block device of %s: %w", path, err)
	}
	major, minor = devMajor(st.Dev), devMinor(st.Dev)
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)
	if _, err := os.Stat(sys); err != nil {
		return 0, 0, fmt.Errorf("cgroup: %s is not on a block device (%d:%d); io limits need one", path, major, minor)
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		b, err := os.ReadFile(sys + "/../dev") // through the link: the disk
		if err == nil {
			if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err == nil {
				return major, minor, nil
			}
		}
	}
	return major, minor, nil
}
