package cowfs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// guardChildEnv makes the test binary a guarded server (guardChild).
const guardChildEnv = "TINE_COWFS_GUARD_CHILD"

// guardChild starts the guard, mounts branch main of the FS at args[0]
// on args[1], and fsyncs a file of that mount from one of its own threads
// while the fsync is held in the server; it prints BLOCKED once the
// request is held, then waits to be killed. (Without the guard such a
// process, once killed, never ends.)
func guardChild(args []string) {
	if len(args) != 2 {
		fmt.Println("ERR want: root mountpoint")
		return
	}
	if err := StartGuard(); err != nil {
		fmt.Println("ERR", err)
		return
	}
	f, err := Open(args[0], nil)
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	if _, err := f.Mount(context.Background(), "main", args[1], nil); err != nil {
		fmt.Println("ERR", err)
		return
	}
	block := func() {
		fmt.Println("BLOCKED")
		select {}
	}
	fsyncTestHook.Store(&block)
	go func() {
		fd, err := unix.Open(filepath.Join(args[1], "file"), unix.O_RDWR|unix.O_CREAT, 0o644)
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		unix.Fsync(fd) // answered never
	}()
	select {}
}

// startGuardChild runs guardChild over a new state root with branch
// main and returns it once its fsync is held.
func startGuardChild(t *testing.T) (cmd *exec.Cmd, root, mnt string) {
	t.Helper()
	root, mnt = rootWithMain(t, nil, ""), t.TempDir()
	return startChild(t, guardChildEnv+"="+root+" "+mnt, "BLOCKED"), root, mnt
}

// waitOrUnstick waits up to d for cmd to end. If it does not, it aborts
// the connection of the mount at mnt (so that no unkillable process is
// left behind), waits again and reports false.
func waitOrUnstick(t *testing.T, cmd *exec.Cmd, mnt string, d time.Duration) bool {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return true
	case <-time.After(d):
	}
	if ms, _ := mountsAt(mnt); len(ms) > 0 {
		id := strconv.FormatUint(uint64(ms[len(ms)-1].minor), 10)
		if err := os.WriteFile(filepath.Join(fusectl, id, "abort"), []byte("1"), 0); err != nil {
			t.Errorf("abort connection %s: %v", id, err)
		}
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("the killed server did not end even after its connection was aborted")
	}
	return false
}

// TestGuardEndsKilledServer kills a server while one of its own threads
// waits for it to answer on its own mount: with the guard the process
// ends and the next Open of its root cleans the dead mount up.
func TestGuardEndsKilledServer(t *testing.T) {
	needFUSE(t)
	cmd, root, mnt := startGuardChild(t)
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if !waitOrUnstick(t, cmd, mnt, 15*time.Second) {
		t.Fatal("the killed server stayed a zombie: its guard did not abort its mount")
	}
	f, err := Open(root, nil)
	if err != nil {
		t.Fatalf("open the root after the kill: %v", err)
	}
	defer f.Close()
	if ms, _ := mountsAt(mnt); len(ms) != 0 {
		t.Errorf("the dead mount is still there after Open: %+v", ms)
	}
}

// TestGuardIgnoresTermWhileParentLives: signals sent to the guard by
// anyone while its server lives (its parent-death signal included) abort
// nothing and do not end it.
func TestGuardIgnoresTermWhileParentLives(t *testing.T) {
	needFUSE(t)
	cmd, _, mnt := startGuardChild(t)
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	guardPID := findGuard(t, cmd.Process.Pid)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, guardSignal} {
		if err := syscall.Kill(guardPID, sig); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(mnt, "file")); err != nil {
		t.Errorf("the mount stopped answering after its guard got signals: %v", err)
	}
	cmd.Process.Kill()
	if !waitOrUnstick(t, cmd, mnt, 15*time.Second) {
		t.Error("after stray signals the guard no longer ended its killed server")
	}
}

// findGuard returns the pid of the guard started by process pid.
func findGuard(t *testing.T, pid int) int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, p := range tasks {
		b, _ := os.ReadFile(p)
		for _, c := range strings.Fields(string(b)) {
			cmdline, _ := os.ReadFile("/proc/" + c + "/cmdline")
			if strings.HasPrefix(string(cmdline), "tine-fuse-guard") {
				n, _ := strconv.Atoi(c)
				return n
			}
		}
	}
	t.Fatalf("no guard among the children of %d", pid)
	return 0
}
