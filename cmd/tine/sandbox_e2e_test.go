package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"tine/api"
	"tine/cowfs"
	"tine/internal/syncbuf"
	"tine/sandbox/ns"
)

// tineBin is the tine binary the end-to-end tests run, with a static
// tine-agent beside it.
var tineBin string

func TestMain(m *testing.M) {
	cowfs.GuardMain() // the guard of a daemon served in this process
	ns.Init()
	if os.Getenv("TINE_TEST_DIAL") != "" {
		os.Exit(m.Run()) // the other user's side of TestDaemonSocketPrivate
	}
	dir, err := os.MkdirTemp("", "tine-cli-bin")
	if err != nil {
		panic(err)
	}
	tineBin = filepath.Join(dir, "tine")
	for _, b := range [][2]string{{tineBin, "tine/cmd/tine"}, {filepath.Join(dir, "tine-agent"), "tine/cmd/tine-agent"}} {
		cmd := exec.Command("go", "build", "-o", b[0], b[1])
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b[1], err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestEveryCommandHasJSONAndRoot walks the command tree: every command
// takes --json and --root.
func TestEveryCommandHasJSONAndRoot(t *testing.T) {
	a := &app{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	n := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		n++
		for _, f := range []string{"json", "root"} {
			if c.Flags().Lookup(f) == nil && c.InheritedFlags().Lookup(f) == nil && c.PersistentFlags().Lookup(f) == nil {
				t.Errorf("%q has no --%s", c.CommandPath(), f)
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(a.rootCommand())
	if n < 40 {
		t.Errorf("walked %d commands, want the whole tree (40 or more)", n)
	}
}

// daemonCLI returns a cli on a fresh, initialised state root under the
// test's temporary directory base, whose daemon is stopped when the test
// ends. It skips the test where sandboxes cannot run (not root, no FUSE).
func daemonCLI(t *testing.T) (c cli, base string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("sandboxes need /dev/fuse")
	}
	base = t.TempDir()
	c = cli{t: t, root: filepath.Join(base, "root")}
	c.ok("init")
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(c.root, api.SocketName)); err == nil {
			c.stopDaemon()
		}
	})
	return c, base
}

// cli runs the tine binary with --root root, stdin from in.
type cli struct {
	t    *testing.T
	root string
}

func (c cli) run(in string, args ...string) (string, string, int) {
	c.t.Helper()
	cmd := exec.Command(tineBin, append([]string{"--root", c.root}, args...)...)
	cmd.Stdin = strings.NewReader(in)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("tine %q: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// ok runs a command that must succeed and returns its stdout.
func (c cli) ok(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.run("", args...)
	if code != 0 {
		c.t.Fatalf("tine %q: exit %d\nstdout: %s\nstderr: %s\ndaemon log:\n%s", args, code, out, errOut, logTail(filepath.Join(c.root, daemonLog), 0, 20))
	}
	return out
}

// daemonPID returns the pid of the daemon the log says listens now.
func (c cli) daemonPID() int {
	b, _ := os.ReadFile(filepath.Join(c.root, daemonLog))
	m := regexp.MustCompile(`listening on .* \(pid (\d+)\)`).FindAllSubmatch(b, -1)
	if len(m) == 0 {
		c.t.Fatalf("no daemon in the log:\n%s", b)
	}
	pid, _ := strconv.Atoi(string(m[len(m)-1][1]))
	return pid
}

// stopDaemon ends the daemon with SIGTERM and waits for it to be gone.
func (c cli) stopDaemon() {
	pid := c.daemonPID()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return
	}
	for deadline := time.Now().Add(60 * time.Second); syscall.Kill(pid, 0) == nil; {
		if time.Now().After(deadline) {
			c.t.Fatalf("daemon %d did not stop after SIGTERM", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSandboxEndToEnd drives sandboxes through the CLI and a real daemon
// that the first command starts: create from a project directory, exec,
// fork, diff, snapshot and rollback, errors, a daemon restart, rm.
func TestSandboxEndToEnd(t *testing.T) {
	c, base := daemonCLI(t)
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "hello.txt"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(proj, "gone.txt"), []byte("bye\n"), 0o644)

	// create --json parses; the daemon was started for it.
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(c.ok("create", "--from", proj, "--name", "a", "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Name != "a" || sb.ProjectPath != proj || sb.State != "running" {
		t.Fatalf("create: %+v", sb)
	}
	if !strings.Contains(logTail(filepath.Join(c.root, daemonLog), 0, 50), "listening on") {
		t.Errorf("no autostarted daemon in %s", daemonLog)
	}

	// exec: output, exit codes, stdin.
	if out := c.ok("exec", "a", "--", "cat", filepath.Join(proj, "hello.txt")); out != "hello\n" {
		t.Errorf("cat in the sandbox: %q", out)
	}
	if _, _, code := c.run("", "exec", "a", "--", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exit 7 in the sandbox: tine exited %d", code)
	}
	if out, errOut, code := c.run("piped input\n", "exec", "-i", "a", "--", "cat"); code != 0 || out != "piped input\n" {
		t.Errorf("exec -i cat: exit %d, %q, %q", code, out, errOut)
	}
	if out, _, code := c.run("ignored\n", "exec", "a", "--", "cat"); code != 0 || out != "" {
		t.Errorf("exec without -i read stdin: exit %d, %q", code, out)
	}
	// Without --cwd a command starts in the project directory; --cwd moves it.
	if out := c.ok("exec", "a", "--", "pwd"); out != proj+"\n" {
		t.Errorf("exec without --cwd ran in %q, want the project directory %s", out, proj)
	}
	if out := c.ok("exec", "--cwd", "/tmp", "a", "--", "pwd"); out != "/tmp\n" {
		t.Errorf("exec --cwd /tmp ran in %q", out)
	}

	// Changes: one modified, one deleted, one added.
	c.ok("exec", "--cwd", proj, "a", "--", "sh", "-c", "echo changed > hello.txt && rm gone.txt && echo new > new.txt")
	if _, err := os.Stat(filepath.Join(proj, "gone.txt")); err != nil {
		t.Errorf("a write in the sandbox reached the host: %v", err)
	}
	var changes []api.Change
	if err := json.Unmarshal([]byte(c.ok("diff", "a", "--json")), &changes); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, ch := range changes {
		kinds[filepath.Base(ch.Path)] = ch.Kind
	}
	if kinds["hello.txt"] != "modified" || kinds["gone.txt"] != "deleted" || kinds["new.txt"] != "added" {
		t.Errorf("diff: %+v", changes)
	}
	if text := c.ok("diff", "a"); !strings.Contains(text, "D gone.txt") && !strings.Contains(text, "D "+filepath.Join(proj, "gone.txt")) {
		t.Errorf("diff text lacks the deletion:\n%s", text)
	}

	// fork -n 2: each fork starts with a's files and then goes its own way.
	var kids []api.Sandbox
	if err := json.Unmarshal([]byte(c.ok("fork", "a", "-n", "2", "--json")), &kids); err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 {
		t.Fatalf("fork -n 2 made %d", len(kids))
	}
	for i, k := range kids {
		if out := c.ok("exec", k.Name, "--", "cat", filepath.Join(proj, "hello.txt")); out != "changed\n" {
			t.Errorf("fork %s sees %q", k.Name, out)
		}
		c.ok("exec", k.Name, "--", "sh", "-c", fmt.Sprintf("echo fork%d > %s/hello.txt", i, proj))
	}
	for i, k := range kids {
		if out := c.ok("exec", k.Name, "--", "cat", filepath.Join(proj, "hello.txt")); out != fmt.Sprintf("fork%d\n", i) {
			t.Errorf("fork %s after its write sees %q", k.Name, out)
		}
	}
	if out := c.ok("exec", "a", "--", "cat", filepath.Join(proj, "hello.txt")); out != "changed\n" {
		t.Errorf("parent sees %q after the forks wrote", out)
	}

	// snapshot and rollback.
	c.ok("snapshot", "a", "--name", "s1")
	c.ok("exec", "a", "--", "sh", "-c", "echo later > "+proj+"/hello.txt")
	if out := c.ok("snapshots", "a"); !strings.Contains(out, "s1") {
		t.Errorf("snapshots lacks s1:\n%s", out)
	}
	c.ok("rollback", "a", "s1")
	if out := c.ok("exec", "a", "--", "cat", filepath.Join(proj, "hello.txt")); out != "changed\n" {
		t.Errorf("after rollback to s1: %q", out)
	}

	// An unknown sandbox: exit 1, named, with what to do.
	_, errOut, code := c.run("", "exec", "nosuch", "--", "true")
	if code != 1 || !strings.Contains(errOut, `sandbox "nosuch" not found`) || !strings.Contains(errOut, "tine ls") {
		t.Errorf("exec in an unknown sandbox: exit %d, %q", code, errOut)
	}
	if _, _, code := c.run("", "exec", "a"); code != 2 {
		t.Errorf("exec without a command: exit %d, want 2", code)
	}

	// A daemon restart loses nothing: the sandbox is listed, stopped, and
	// starts again with its files.
	old := c.daemonPID()
	c.stopDaemon()
	var list []api.Sandbox
	if err := json.Unmarshal([]byte(c.ok("ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if c.daemonPID() == old {
		t.Errorf("ls did not start a new daemon")
	}
	states := map[string]string{}
	for _, s := range list {
		states[s.Name] = string(s.State)
	}
	if len(states) != 3 || states["a"] != "stopped" {
		t.Errorf("after a daemon restart: %v", states)
	}
	c.ok("start", "a")
	if out := c.ok("exec", "a", "--", "cat", filepath.Join(proj, "hello.txt")); out != "changed\n" {
		t.Errorf("after restart: %q", out)
	}

	// Bad flag values are usage errors that name the flag.
	for _, args := range [][]string{
		{"exec", "--timeout", "-1s", "a", "--", "true"},
		{"exec", "--cwd", "sub", "a", "--", "true"},
		{"create", "--from", proj, "--lifetime", "-5s"},
		{"create", "--from", proj, "--idle", "-5s"},
	} {
		flag := args[1]
		if args[0] == "create" {
			flag = args[3]
		}
		if _, errOut, code := c.run("", args...); code != 2 || !strings.Contains(errOut, flag) {
			t.Errorf("tine %q: exit %d, %q; want 2 and the flag named", args, code, errOut)
		}
	}

	// A command that ignores the signals tine forwards: the third SIGINT
	// ends tine (exit 130), and the daemon ends the command.
	cmd := exec.Command(tineBin, "--root", c.root, "exec", "a", "--", "sh", "-c", "trap '' INT TERM HUP; echo ready; sleep 60")
	var stdout, stderr syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stdout.String(), "ready"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the command did not start: %q %q", stdout.String(), stderr.String())
		}
	}
	for range 3 {
		cmd.Process.Signal(syscall.SIGINT)
		time.Sleep(100 * time.Millisecond)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("tine exec still waits after three SIGINTs: %q", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 || !strings.Contains(stderr.String(), "stopped waiting") {
		t.Errorf("three SIGINTs: exit %d, %q", code, stderr.String())
	}
	for deadline := time.Now().Add(20 * time.Second); strings.Contains(c.ok("ps", "a"), "sleep 60"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the command still runs after tine exec gave up on it")
		}
	}

	// rm: a running sandbox needs -f.
	if _, errOut, code := c.run("", "rm", "a"); code != 1 || !strings.Contains(errOut, "rm -f") {
		t.Errorf("rm of a running sandbox: exit %d, %q", code, errOut)
	}
	c.ok("rm", "-f", "a", kids[0].Name, kids[1].Name)
	if out := c.ok("ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("ls after rm: %s", out)
	}
}

// TestInfoWithoutDaemon: info answers with no daemon, and says so.
func TestInfoWithoutDaemon(t *testing.T) {
	root := newRoot(t)
	out, errOut, code := tine(t, "info", "--json", "--root", root)
	if code != 0 {
		t.Fatalf("info: exit %d: %s", code, errOut)
	}
	var info struct {
		api.Info
		Daemon bool `json:"daemon"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatal(err)
	}
	if info.Daemon || len(info.Runtimes) < 2 {
		t.Errorf("info without a daemon: %+v", info)
	}
	for _, r := range info.Runtimes {
		if !r.Available && r.Reason == "" {
			t.Errorf("runtime %s %s unavailable without a reason", r.Name, r.Mode)
		}
	}
}

// TestCompletion: cobra's completion scripts for the three shells.
func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, errOut, code := tine(t, "completion", sh)
		if code != 0 || !strings.Contains(out, "tine") {
			t.Errorf("completion %s: exit %d, %q", sh, code, errOut)
		}
	}
	if _, _, code := tine(t, "completion", "tcsh"); code != 2 {
		t.Errorf("completion tcsh: exit %d, want 2", code)
	}
}
