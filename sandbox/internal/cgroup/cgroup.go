// Package cgroup puts a sandbox's processes in a control group of their
// own: pids, memory, cpu and io limits, cpu accounting, the freezer and a
// kill of the whole group, on cgroup v2 (one unified hierarchy) or v1
// (one hierarchy per controller; see limits.go).
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Root is where cgroup file systems are mounted.
const Root = "/sys/fs/cgroup"

// parent is the group every sandbox group is made under.
const parent = "tine"

// Group is one sandbox's control group.
type Group struct {
	v2   bool
	dirs []string // v2: one dir; v1: pids dir first, freezer dir last
}

// V2 reports whether the host uses the unified hierarchy with controllers.
func V2() bool {
	_, err := os.Stat(filepath.Join(Root, "cgroup.controllers"))
	return err == nil
}

// New makes group name with at most pidsMax tasks (0: no limit). A group
// left by an earlier run of the same name is reused once it is empty.
func New(name string, pidsMax int64) (*Group, error) {
	g := &Group{v2: V2()}
	if g.v2 {
		top := filepath.Join(Root, parent)
		if err := os.MkdirAll(top, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: create %s: %w", top, err)
		}
		if err := enableV2(top); err != nil {
			return nil, err
		}
		g.dirs = []string{filepath.Join(top, name)}
	} else {
		g.dirs = v1Dirs(name)
	}
	for _, d := range g.dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: create %s: %w", d, err)
		}
	}
	if pidsMax > 0 {
		p := filepath.Join(g.dirs[0], "pids.max")
		if err := os.WriteFile(p, []byte(strconv.FormatInt(pidsMax, 10)), 0); err != nil {
			return nil, fmt.Errorf("cgroup: set %s: %w", p, err)
		}
	}
	return g, nil
}

// Add moves process pid into the group.
func (g *Group) Add(pid int) error {
	for _, d := range g.dirs {
		p := filepath.Join(d, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cgroup: add pid %d to %s: %w", pid, p, err)
		}
	}
	return nil
}

func (g *Group) freezerDir() string { return g.dirs[len(g.dirs)-1] }

// Freeze stops every task of the group and returns once all are frozen.
func (g *Group) Freeze(ctx context.Context) error {
	if g.v2 {
		return g.setFrozen(ctx, "cgroup.freeze", "1", "cgroup.events", "frozen 1")
	}
	keepFreezerOn()
	return g.setFrozen(ctx, "freezer.state", "FROZEN", "freezer.state", "FROZEN")
}

// keeper is a v1 freezer group, beside the sandboxes' groups, that is
// kept frozen and empty (ADR 0192). The v1 freezer turns a kernel static
// key on when a group starts freezing and off when the last frozen group
// thaws, and each switch patches the kernel's code: about 1.5 ms a write
// of freezer.state on these hosts. While the keeper stays frozen the key
// stays on, and a sandbox's freeze and thaw cost about 0.03 ms each. The
// name cannot be a sandbox's (those begin with tine- or warm-).
const keeper = ".keep-frozen"

var keeperOnce sync.Once

// keepFreezerOn makes the keeper and freezes it, once a process; it is
// left in place for other processes and later runs. A failure only
// leaves freezes slower.
func keepFreezerOn() {
	keeperOnce.Do(func() {
		d := filepath.Join(Root, "freezer", parent, keeper)
		if os.MkdirAll(d, 0o755) == nil {
			os.WriteFile(filepath.Join(d, "freezer.state"), []byte("FROZEN"), 0)
		}
	})
}

// Thaw lets the group's tasks run again.
func (g *Group) Thaw(ctx context.Context) error {
	if g.v2 {
		return g.setFrozen(ctx, "cgroup.freeze", "0", "cgroup.events", "frozen 0")
	}
	return g.setFrozen(ctx, "freezer.state", "THAWED", "freezer.state", "THAWED")
}

// setFrozen writes val to file and polls state until it contains want.
func (g *Group) setFrozen(ctx context.Context, file, val, state, want string) error {
	d := g.freezerDir()
	for delay := 50 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		// v1 may report FREEZING and need the write again.
		if err := os.WriteFile(filepath.Join(d, file), []byte(val), 0); err != nil {
			return fmt.Errorf("cgroup: write %s to %s: %w", val, filepath.Join(d, file), err)
		}
		b, err := os.ReadFile(filepath.Join(d, state))
		if err != nil {
			return fmt.Errorf("cgroup: read %s: %w", filepath.Join(d, state), err)
		}
		if strings.Contains(string(b), want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup: %s in %s did not reach %q: %w", file, d, want, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// Pids returns the processes in the group.
func (g *Group) Pids() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(g.dirs[0], "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cgroup: list %s: %w", g.dirs[0], err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// Remove kills whatever is still in the group, waits until it is empty
// and deletes it.
func (g *Group) Remove(ctx context.Context) error {
	if g.v2 {
		os.WriteFile(filepath.Join(g.dirs[0], "cgroup.kill"), []byte("1"), 0)
	}
	// Frozen tasks cannot die: thaw first (v1; v2 kills frozen tasks).
	if !g.v2 {
		os.WriteFile(filepath.Join(g.freezerDir(), "freezer.state"), []byte("THAWED"), 0)
	}
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
		pids, err := g.Pids()
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup: %s still holds %d processes: %w", g.dirs[0], len(pids), ctx.Err())
		case <-time.After(delay):
		}
	}
	var errs []error
	for _, d := range g.dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cgroup: remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
