package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSetAndStats: limits land in the group's files, change, and are
// removed; a task in the group is counted and its CPU time read.
func TestSetAndStats(t *testing.T) {
	g := testGroup(t, "test")
	read := func(c, f string) string {
		b, err := os.ReadFile(filepath.Join(g.dir(c), f))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	l := Limits{Pids: 10, MemoryBytes: 64 << 20, CPUs: 0.5, Devices: []DeviceRule{{Type: 'c', Major: 1, Minor: 3}}}
	if err := g.Set(l); err != nil {
		t.Fatal(err)
	}
	if g.v2 {
		if read("memory", "memory.max") != "67108864" || read("cpu", "cpu.max") != "50000 100000" || read("pids", "pids.max") != "10" {
			t.Fatalf("v2 limits: %s %s %s", read("memory", "memory.max"), read("cpu", "cpu.max"), read("pids", "pids.max"))
		}
	} else {
		if read("memory", "memory.limit_in_bytes") != "67108864" || read("cpu", "cpu.cfs_quota_us") != "50000" || read("pids", "pids.max") != "10" {
			t.Fatalf("v1 limits: %s %s %s", read("memory", "memory.limit_in_bytes"), read("cpu", "cpu.cfs_quota_us"), read("pids", "pids.max"))
		}
		if DevicesEnforced() && read("devices", "devices.list") != "c 1:3 rwm" {
			t.Fatalf("devices.list: %q", read("devices", "devices.list"))
		}
	}
	// Raise, then remove.
	l.MemoryBytes = 1 << 30
	if err := g.Set(l); err != nil {
		t.Fatal(err)
	}
	if err := g.Set(Limits{}); err != nil {
		t.Fatal(err)
	}
	if !g.v2 && read("cpu", "cpu.cfs_quota_us") != "-1" {
		t.Fatalf("quota after removal: %s", read("cpu", "cpu.cfs_quota_us"))
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	s, err := g.Stats()
	if err != nil || s.Pids != 1 {
		t.Fatalf("stats %+v %v", s, err)
	}
	cmd.Wait()
	time.Sleep(10 * time.Millisecond)
	s, _ = g.Stats()
	if s.CPUNanos == 0 {
		t.Fatalf("no CPU time counted: %+v", s)
	}
	if err := g.Set(Limits{Pids: -1}); err == nil {
		t.Fatal("a negative limit was taken")
	}
}

func TestBlockDevice(t *testing.T) {
	maj, min, err := BlockDevice("/")
	if err != nil {
		t.Skipf("the root is not on a block device here: %v", err)
	}
	if _, err := os.Stat(fmt.Sprintf("/sys/dev/block/%d:%d", maj, min)); err != nil {
		t.Fatalf("%d:%d: %v", maj, min, err)
	}
	if _, err := os.Stat(fmt.Sprintf("/sys/dev/block/%d:%d/partition", maj, min)); err == nil {
		t.Fatalf("%d:%d is a partition, want its disk", maj, min)
	}
}
