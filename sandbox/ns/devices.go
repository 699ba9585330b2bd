package ns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"tine/sandbox"
	"tine/sandbox/internal/cgroup"
)

// baseDevices are the device nodes every sandbox may use: those its /dev
// holds (null, zero, full, random, urandom, tty, the pts instance's ptmx
// and terminals).
var baseDevices = []cgroup.DeviceRule{
	{Type: 'c', Major: 1, Minor: 3}, {Type: 'c', Major: 1, Minor: 5}, {Type: 'c', Major: 1, Minor: 7},
	{Type: 'c', Major: 1, Minor: 8}, {Type: 'c', Major: 1, Minor: 9}, {Type: 'c', Major: 5, Minor: 0},
	{Type: 'c', Major: 5, Minor: 2}, {Type: 'c', Major: 136, Minor: -1}, {Type: 'c', Major: 137, Minor: -1},
	{Type: 'c', Major: 138, Minor: -1}, {Type: 'c', Major: 139, Minor: -1}, {Type: 'c', Major: 140, Minor: -1},
	{Type: 'c', Major: 141, Minor: -1}, {Type: 'c', Major: 142, Minor: -1}, {Type: 'c', Major: 143, Minor: -1},
}

// passThrough is what a sandbox gets of the host's devices.
type passThrough struct {
	Devices  []string // host device nodes, bound at the same path
	ReadOnly []string // host files bound read-only over themselves (GPU driver libraries and tools)
	rules    []cgroup.DeviceRule
}

// devicesFor resolves a sandbox's Devices and GPU limits.
func devicesFor(l sandbox.Limits) (*passThrough, error) {
	pt := &passThrough{rules: append([]cgroup.DeviceRule(nil), baseDevices...)}
	devs := append([]string(nil), l.Devices...)
	if l.GPU {
		g, libs, err := nvidia()
		if err != nil {
			return nil, err
		}
		devs = append(devs, g...)
		pt.ReadOnly = libs
	}
	seen := map[string]bool{}
	for _, d := range devs {
		if seen[d] {
			continue
		}
		seen[d] = true
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return nil, fmt.Errorf("device %s: %w", d, err)
		}
		var typ byte
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			typ = 'c'
		case unix.S_IFBLK:
			typ = 'b'
		default:
			return nil, fmt.Errorf("device %s: not a device node", d)
		}
		pt.Devices = append(pt.Devices, d)
		pt.rules = append(pt.rules, cgroup.DeviceRule{Type: typ, Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev))})
	}
	return pt, nil
}

// nvidia finds the host's NVIDIA device nodes and the driver's user-space
// libraries and tools.
func nvidia() (devs, files []string, err error) {
	for _, g := range []string{"/dev/nvidia*", "/dev/nvidia-caps/*"} {
		m, _ := filepath.Glob(g)
		for _, p := range m {
			if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeDevice != 0 {
				devs = append(devs, p)
			}
		}
	}
	if len(devs) == 0 {
		return nil, nil, fmt.Errorf("--gpu: this host has no /dev/nvidia* device (is the NVIDIA driver loaded?)")
	}
	seen := map[string]bool{}
	add := func(p string) {
		if r, err := filepath.EvalSymlinks(p); err == nil && !seen[r] {
			seen[r] = true
			files = append(files, r)
		}
	}
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			i := strings.Index(line, "=> ")
			if i < 0 {
				continue
			}
			p := strings.TrimSpace(line[i+3:])
			b := filepath.Base(p)
			for _, pre := range []string{"libcuda.", "libcudadebugger.", "libnvidia-", "libnvcuvid.", "libnvoptix."} {
				if strings.HasPrefix(b, pre) {
					add(p)
				}
			}
		}
	}
	for _, t := range []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"} {
		if p, err := exec.LookPath(t); err == nil {
			add(p)
		}
	}
	sort.Strings(files)
	return devs, files, nil
}
