package cgroup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// needRoot skips a test run by a user other than root, who cannot make
// groups under the cgroup hierarchies.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("making cgroups under %s needs root; this test runs as uid %d", Root, os.Geteuid())
	}
}

// testGroup makes group PREFIX-PID for a test and removes it after.
func testGroup(t *testing.T, prefix string) *Group {
	t.Helper()
	needRoot(t)
	g, err := New(fmt.Sprintf("%s-%d", prefix, os.Getpid()), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Remove(context.Background()) })
	return g
}

// procState returns the state letter of pid from /proc/PID/stat.
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return rest[:1]
}

// TestFreezeThaw: a task of a frozen group stops running and runs again
// once thawed; on v1, the first freeze leaves the keeper group frozen and
// empty (ADR 0192), and freezes after it still work.
func TestFreezeThaw(t *testing.T) {
	g := testGroup(t, "test-freeze")
	// A busy task, whose CPU time moves only while it is thawed.
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := g.Freeze(ctx); err != nil {
			t.Fatal(err)
		}
		if s := procState(t, cmd.Process.Pid); s != "D" && s != "S" {
			t.Fatalf("round %d: frozen task is in state %q, want a sleep (D or S)", i, s)
		}
		if !g.v2 {
			d := filepath.Join(Root, "freezer", parent, keeper)
			st, _ := os.ReadFile(filepath.Join(d, "freezer.state"))
			procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if strings.TrimSpace(string(st)) != "FROZEN" || len(procs) != 0 {
				t.Fatalf("keeper %s: state %q, tasks %q; want FROZEN and none", d, st, procs)
			}
		}
		if err := g.Thaw(ctx); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for procState(t, cmd.Process.Pid) != "R" {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: thawed task never ran again (state %q)", i, procState(t, cmd.Process.Pid))
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// TestLeftovers: a group found again by name (a process that died left
// it) is removed from every hierarchy; RemoveLeftovers removes the empty
// groups of a prefix old enough, and keeps one with a task.
func TestLeftovers(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("test-left-%d-", os.Getpid())
	gone := func(name string) {
		t.Helper()
		for _, d := range groupDirs(name) {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("%s is left", d)
			}
		}
	}
	// Found again and removed whole.
	if _, err := New(prefix+"a", 0); err != nil {
		t.Fatal(err)
	}
	g := Existing(prefix + "a")
	if g == nil {
		t.Fatal("Existing does not find the group just made")
	}
	if err := g.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	gone(prefix + "a")
	// Empty and old enough: removed; with a task: kept.
	empty, err := New(prefix+"empty", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Remove(ctx)
	busy, err := New(prefix+"busy", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Remove(ctx)
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if err := busy.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if n := RemoveLeftovers(ctx, prefix, time.Hour); n != 0 {
		t.Fatalf("RemoveLeftovers removed %d groups younger than its age", n)
	}
	if n := RemoveLeftovers(ctx, prefix, 0); n != 1 {
		t.Fatalf("RemoveLeftovers removed %d groups, want 1 (the empty one)", n)
	}
	gone(prefix + "empty")
	if Existing(prefix+"busy") == nil {
		t.Fatal("RemoveLeftovers removed a group with a task")
	}
}

// groupDirs lists where New makes group name.
func groupDirs(name string) []string {
	if V2() {
		return []string{filepath.Join(Root, parent, name)}
	}
	return v1Dirs(name)
}
