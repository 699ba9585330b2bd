package cgroup

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Existing returns group name as an earlier run left it, or nil when
// there is no such group.
func Existing(name string) *Group {
	g := &Group{v2: V2()}
	if g.v2 {
		g.dirs = []string{filepath.Join(Root, parent, name)}
	} else {
		// Every hierarchy New makes it in, so that Remove leaves none.
		g.dirs = v1Dirs(name)
	}
	for _, d := range g.dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			return g
		}
	}
	return nil
}

// RemoveLeftovers removes the groups whose name begins with prefix, hold
// no task, and were made more than age ago: such a group was left by a
// process that died, since a live one puts its tasks in at once. It
// returns how many it removed.
func RemoveLeftovers(ctx context.Context, prefix string, age time.Duration) int {
	top := filepath.Join(Root, parent)
	if !V2() {
		top = filepath.Join(Root, "pids", parent)
	}
	ents, _ := os.ReadDir(top)
	n := 0
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < age {
			continue
		}
		g := Existing(e.Name())
		if g == nil {
			continue
		}
		if pids, err := g.Pids(); err != nil || len(pids) > 0 {
			continue
		}
		if g.Remove(ctx) == nil {
			n++
		}
	}
	return n
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
