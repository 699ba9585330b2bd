package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// CanRename reports whether groups can be renamed here: cgroup v1 only,
// since v2 refuses to rename a group.
func CanRename() bool { return !V2() }

// Rename gives the group a new name under the same parent, keeping its
// tasks, its limits and the cgroup namespaces rooted at it. An empty
// group already holding the name (left by an earlier run) is removed
// first.
func (g *Group) Rename(name string) error {
	if g.v2 {
		return errors.New("cgroup: v2 groups cannot be renamed")
	}
	for i, d := range g.dirs {
		to := filepath.Join(filepath.Dir(d), name)
		os.Remove(to) // fails unless it is an empty group
		if err := os.Rename(d, to); err != nil {
			return fmt.Errorf("cgroup: rename %s to %s: %w", d, name, err)
		}
		g.dirs[i] = to
	}
	return nil
}

// SetPidsMax sets the most tasks of the group (0: no limit).
func (g *Group) SetPidsMax(n int64) error {
	v := "max"
	if n > 0 {
		v = strconv.FormatInt(n, 10)
	}
	p := filepath.Join(g.dirs[0], "pids.max")
	if err := os.WriteFile(p, []byte(v), 0); err != nil {
		return fmt.Errorf("cgroup: set %s: %w", p, err)
	}
	return nil
}
