package ns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"tine/sandbox/internal/cgroup"
)

// group is what a sandbox's processes are held by: its cgroups (as root)
// or, in rootless mode, its pid namespace (sigGroup).
type group interface {
	Add(pid int) error
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
	Remove(ctx context.Context) error
}

// newGroup returns the sandbox's cgroups, or in rootless mode a sigGroup,
// which has no pids limit: a rootless sandbox asking for one is refused.
func newGroup(id string, pidsMax int64) (group, error) {
	if !Rootless() {
		return cgroup.New(id, pidsMax)
	}
	if pidsMax > 0 {
		return nil, fmt.Errorf("a pids limit (%d) needs cgroups, which rootless mode does not have here: run tine as root, or create the sandbox without one", pidsMax)
	}
	return &sigGroup{}, nil
}

// sigGroup holds a rootless sandbox by its pid namespace: Freeze stops
// every process in it with SIGSTOP (until a scan finds none left
// running), Thaw continues them. Unlike the freezer, a process sees
// SIGSTOP and SIGCONT (as a job control stop), and one forking in the
// meantime is caught by the next scan.
type sigGroup struct {
	pid int    // the init step: pid 1 of the namespace
	ns  string // its pid namespace, as /proc/PID/ns/pid reads
}

func (g *sigGroup) Add(pid int) error {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return fmt.Errorf("sandbox pid namespace: %w", err)
	}
	g.pid, g.ns = pid, ns
	return nil
}

// members lists the processes in the sandbox's pid namespace.
func (g *sigGroup) members() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err == nil && ns == g.ns {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// state is the process state letter of /proc/PID/stat ('T' stopped).
func state(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

func (g *sigGroup) Freeze(ctx context.Context) error {
	if g.ns == "" {
		return errors.New("sandbox not started")
	}
	for delay := 50 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		pids, err := g.members()
		if err != nil {
			return fmt.Errorf("stop the sandbox's processes: %w", err)
		}
		running := 0
		for _, p := range pids {
			if s := state(p); s != 'T' && s != 't' && s != 'Z' && s != 0 {
				running++
				unix.Kill(p, unix.SIGSTOP)
			}
		}
		if running == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stop the sandbox's processes: %w", ctx.Err())
		case <-time.After(delay):
		}
	}
}

func (g *sigGroup) Thaw(ctx context.Context) error {
	pids, err := g.members()
	if err != nil {
		return fmt.Errorf("continue the sandbox's processes: %w", err)
	}
	for _, p := range pids {
		unix.Kill(p, unix.SIGCONT)
	}
	return nil
}

// Remove has nothing to do: the processes die with pid 1 of their
// namespace.
func (g *sigGroup) Remove(ctx context.Context) error { return nil }
