package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// Existing returns group name as an earlier run left it, or nil when
// there is no such group.
func Existing(name string) *Group {
	g := &Group{v2: V2()}
	if g.v2 {
		g.dirs = []string{filepath.Join(Root, parent, name)}
	} else {
		g.dirs = []string{filepath.Join(Root, "pids", parent, name), filepath.Join(Root, "freezer", parent, name)}
	}
	for _, d := range g.dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			return g
		}
	}
	return nil
}

// Frozen reports whether the group's freezer holds its tasks stopped.
func (g *Group) Frozen() bool {
	if g.v2 {
		b, _ := os.ReadFile(filepath.Join(g.freezerDir(), "cgroup.events"))
		return strings.Contains(string(b), "frozen 1")
	}
	b, _ := os.ReadFile(filepath.Join(g.freezerDir(), "freezer.state"))
	return strings.Contains(string(b), "FROZEN") || strings.Contains(string(b), "FREEZING")
}
