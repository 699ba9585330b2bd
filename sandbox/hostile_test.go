package sandbox_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"tine/sandbox"
)

// TestHostile: what a sandbox's root must not be able to do, in a sandbox
// started cold and in one bound to a warm instance. Each case is a shell
// script that prints "ESCAPED" only if the attempt succeeded.
func TestHostile(t *testing.T) {
	t.Run("cold", func(t *testing.T) { testHostile(t, newEnv(t, 0)) })
	t.Run("warm", func(t *testing.T) {
		e := newEnvWith(t, sandbox.Options{Warm: 1})
		testHostile(t, e)
		if e.rt.WarmBound() != 1 {
			t.Fatal("the sandbox did not take the warm instance")
		}
	})
}

func testHostile(t *testing.T, e *env) {
	e.create("h", sandbox.Limits{Pids: 64})
	marker := fmt.Sprintf("/tmp/tine-hostile-%d", os.Getpid())
	os.Remove(marker)
	t.Cleanup(func() { os.Remove(marker) })
	host := os.Getpid()
	cases := []struct{ name, script string }{
		{"symlink out of the project", fmt.Sprintf("ln -s %s %s/ln && echo x > %s/ln; true", marker, e.project, e.project)},
		{"dotdot out of the project", fmt.Sprintf("echo x > %s/../../../../..%s; true", e.project, marker)},
		{"proc self root", fmt.Sprintf("echo x > /proc/self/root%s; echo x > /proc/1/root%s; true", marker, marker)},
		{"signal a host pid", fmt.Sprintf("kill -0 %d 2>/dev/null && echo ESCAPED; true", host)},
		{"see host processes", "test $(ls -d /proc/[0-9]* | wc -l) -lt 10 || echo ESCAPED"},
		{"mount", "mount -t tmpfs none /mnt 2>/dev/null && echo ESCAPED; true"},
		{"unshare a user namespace", "unshare -U true 2>/dev/null && echo ESCAPED; unshare -r true 2>/dev/null && echo ESCAPED; true"},
		{"ptrace pid 1", "cat /proc/1/environ >/dev/null 2>&1; strace -p 1 -o /dev/null -e trace=none 2>/dev/null & sleep 0.2; grep -q '^TracerPid:[^0]*[1-9]' /proc/1/status && echo ESCAPED; kill %1 2>/dev/null; true"},
		{"load a module", "insmod /nonexistent.ko 2>/dev/null; modprobe dummy 2>/dev/null && echo ESCAPED; true"},
		{"set the clock", "date -s '2001-01-01' >/dev/null 2>&1 && echo ESCAPED; true"},
		{"raw socket", "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1); print(\"ESCAPED\")' 2>/dev/null; true"},
		{"packet socket", "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print(\"ESCAPED\")' 2>/dev/null; true"},
		{"network beyond loopback", "test $(ls /sys/class/net | tr '\\n' ' ') = lo || echo ESCAPED"},
		{"write a host sysctl", "echo 1 > /proc/sys/vm/drop_caches 2>/dev/null && echo ESCAPED; true"},
		{"sysrq", "echo h > /proc/sysrq-trigger 2>/dev/null && echo ESCAPED; true"},
		{"make a device node", "mknod /tmp/sda b 8 0 2>/dev/null && echo ESCAPED; true"},
		{"see the state root", fmt.Sprintf("ls %s 2>/dev/null | grep -q . && echo ESCAPED; true", e.root)},
	}
	for _, c := range cases {
		out, _ := e.sh("h", c.script)
		if strings.Contains(out, "ESCAPED") {
			t.Errorf("%s: the sandbox did it: %s", c.name, out)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s: wrote %s on the host", c.name, marker)
		}
	}
	// ps in the sandbox shows only the sandbox: the agent is pid 1.
	if out := e.mustSh("h", "ps -e -o pid=,comm="); !strings.Contains(out, "1 tine-agent") || strings.Count(out, "\n") > 4 {
		t.Errorf("ps in the sandbox: %q", out)
	}
}

// TestForkBombHeld: a fork bomb stops at the pids limit, the host keeps
// starting processes, and removing the sandbox ends it all.
func TestForkBombHeld(t *testing.T) {
	e := newEnv(t, 0)
	e.create("bomb", sandbox.Limits{Pids: 50})
	start := time.Now()
	// Background the bomb so the command returns; it keeps trying to fork.
	e.mustSh("bomb", "b() { b | b & }; (b) >/dev/null 2>&1 & sleep 1; true")
	// The sandbox cannot even start a counter now: read the cgroup.
	cur, _ := filepath.Glob("/sys/fs/cgroup/*/tine/tine-*-bomb/pids.current")
	cur2, _ := filepath.Glob("/sys/fs/cgroup/tine/tine-*-bomb/pids.current")
	cur = append(cur, cur2...)
	if len(cur) != 1 {
		t.Fatalf("pids.current of the sandbox: %v", cur)
	}
	b, err := os.ReadFile(cur[0])
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if n > 50 {
		t.Fatalf("%d processes in the sandbox, limit 50", n)
	}
	if err := exec1("true"); err != nil {
		t.Fatalf("the host cannot start a process during the bomb: %v", err)
	}
	if err := e.m.Remove(t.Context(), "bomb"); err != nil {
		t.Fatal(err)
	}
	t.Logf("fork bomb held at %d processes; removed after %v", n, time.Since(start))
}

func exec1(name string) error { return exec.Command(name).Run() }
