package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"tine/api"
	"tine/api/client"
)

// daemonLog is the file in the state root that an autostarted daemon
// appends its output to.
const daemonLog = "daemon.log"

// socket is the daemon's socket of the state root.
func (a *app) socket() string {
	root, err := filepath.Abs(a.root)
	if err != nil {
		root = a.root
	}
	return filepath.Join(root, api.SocketName)
}

// client returns a client of the state root's daemon; it connects on
// first use.
func (a *app) client() *client.Client { return client.New(a.socket()) }

// daemon returns a client of the state root's daemon, starting the daemon
// first when it does not answer.
func (a *app) daemon(ctx context.Context) (*client.Client, error) {
	cl := a.client()
	if cl.Ping(ctx) == nil {
		return cl, nil
	}
	root, err := filepath.Abs(a.root)
	if err != nil {
		return nil, err
	}
	if ok, err := isRoot(root); err != nil {
		return nil, err
	} else if !ok {
		// Only the built-in root is made on first use (see openRoot);
		// before the daemon's log is written into it.
		if root != userRoot() {
			return nil, errNoRoot(root)
		}
		if err := initRoot(root); err != nil {
			return nil, err
		}
	}
	if err := startDaemon(ctx, root, cl, a.stderr); err != nil {
		return nil, err
	}
	return cl, nil
}

// startDaemon starts "tine serve" for root in its own session, detached
// from this process (stdin /dev/null, output appended to ROOT/daemon.log),
// and waits until it answers.
func startDaemon(ctx context.Context, root string, cl *client.Client, progress interface{ Write([]byte) (int, error) }) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("start the daemon: find this program: %w", err)
	}
	logPath := filepath.Join(root, daemonLog)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("start the daemon: %w", err)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, 2)
	cmd := exec.Command(exe, "serve", "--root", root)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	closeInheritedOnExec()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the daemon (%s serve --root %s): %w", exe, root, err)
	}
	died := make(chan error, 1)
	go func() { died <- cmd.Wait() }()
	t0 := time.Now()
	said := false
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		if cl.Ping(ctx) == nil {
			if said {
				fmt.Fprintf(progress, "tine: daemon ready after %s\n", time.Since(t0).Round(time.Millisecond))
			}
			return nil
		}
		select {
		case werr := <-died:
			// Another command may have started one at the same time.
			if cl.Ping(ctx) == nil {
				return nil
			}
			return fmt.Errorf("the daemon for %s exited (%v) before it answered; the end of %s:\n%s\nfix the cause, or run \"tine serve --root %s\" in the foreground to see it",
				root, werr, logPath, logTail(logPath, start, 10), root)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		if !said && time.Since(t0) > time.Second {
			fmt.Fprintf(progress, "tine: starting the daemon for %s (log: %s)...\n", root, logPath)
			said = true
		}
		if time.Since(t0) > time.Minute {
			return fmt.Errorf("the daemon for %s (pid %d) did not answer on %s within a minute; see %s", root, cmd.Process.Pid, filepath.Join(root, api.SocketName), logPath)
		}
	}
}

// logTail returns the last n lines of the file at path written after
// offset from.
func logTail(path string, from int64, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	if from >= 0 && from <= int64(len(b)) {
		b = b[from:]
	}
	if len(b) > 64<<10 {
		b = b[len(b)-64<<10:]
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var out bytes.Buffer
	for _, l := range lines {
		out.WriteString("  " + l + "\n")
	}
	return strings.TrimRight(out.String(), "\n")
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec:
// the daemon outlives this command and must not hold what its caller
// passed down (a pipe the caller waits on to reach end of file).
func closeInheritedOnExec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
