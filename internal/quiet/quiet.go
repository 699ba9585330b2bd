// Package quiet lets background work wait for the host's CPUs to have
// room: refills of things made ahead of time (warm sandboxes, pooled
// mounts) start when at least one CPU's worth of time went idle, so that
// they do not compete with the commands of the sandboxes just handed out.
package quiet

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"strconv"
	"time"
)

// Window is how long one measurement of idle time lasts.
const Window = 30 * time.Millisecond

// Wait returns true once the host's CPUs had at least one CPU's worth of
// idle time over a Window, or once max has passed, and false as soon as
// stop is closed. Where /proc/stat cannot be read it waits one Window.
func Wait(stop <-chan struct{}, max time.Duration) bool {
	deadline := time.Now().Add(max)
	idle, total, ok := readCPU()
	for {
		t := time.NewTimer(Window)
		select {
		case <-stop:
			t.Stop()
			return false
		case <-t.C:
		}
		if !ok || !time.Now().Before(deadline) {
			return true
		}
		i, n, ok2 := readCPU()
		if ok2 && n > total && roomFor(i-idle, n-total, numCPU()) {
			return true
		}
		idle, total, ok = i, n, ok2
	}
}

// roomFor says whether idle of total ticks across ncpu CPUs is at least
// one CPU's worth (a little less, for the ticks' granularity).
func roomFor(idle, total uint64, ncpu int) bool {
	return idle*uint64(ncpu)*10 >= total*9
}

// readCPU and numCPU are replaced in tests.
var (
	readCPU = cpuTimes
	numCPU  = runtime.NumCPU
)

// cpuTimes returns the idle (idle and iowait) and total ticks of all
// CPUs from /proc/stat's first line.
func cpuTimes() (idle, total uint64, ok bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadSlice('\n')
	if err != nil {
		return 0, 0, false
	}
	return parseCPULine(line)
}

// parseCPULine reads the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal (guest time is already in user).
func parseCPULine(line []byte) (idle, total uint64, ok bool) {
	fields := bytes.Fields(line)
	if len(fields) < 5 || string(fields[0]) != "cpu" {
		return 0, 0, false
	}
	for i, f := range fields[1:min(len(fields), 9)] {
		v, err := strconv.ParseUint(string(f), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += v
		if i == 3 || i == 4 {
			idle += v
		}
	}
	return idle, total, true
}
