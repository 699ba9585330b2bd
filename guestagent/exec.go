package guestagent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tine/guestagent/proto"
)

// defaultPath is the PATH of a process whose request sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// withDefaults is env with what a login would have given the command and
// env does not set: PATH, HOME (uid's home in /etc/passwd, else /root
// for root and / for others) and, on a terminal, TERM. A request that
// sets some variables keeps these: git needs HOME, a shell PATH.
func withDefaults(env []string, uid uint32, tty bool) []string {
	has := func(k string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	}
	out := env[:len(env):len(env)]
	if !has("PATH") {
		out = append(out, "PATH="+defaultPath)
	}
	if !has("HOME") {
		out = append(out, "HOME="+homeOf(uid))
	}
	if tty && !has("TERM") {
		out = append(out, "TERM=xterm")
	}
	return out
}

// homeOf is uid's home directory in /etc/passwd, or /root for root and /
// for others when it names none.
func homeOf(uid uint32) string {
	home := "/"
	if uid == 0 {
		home = "/root"
	}
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return home
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 4<<20))
	want := strconv.FormatUint(uint64(uid), 10)
	for sc.Scan() {
		parts := strings.Split(sc.Text(), ":")
		if len(parts) >= 6 && parts[2] == want && strings.HasPrefix(parts[5], "/") {
			return parts[5]
		}
	}
	return home
}

// execution is one process started by an exec request.
type execution struct {
	a   *Agent
	c   *conn
	id  uint32
	pid int
	tty *os.File // the terminal's master side, or nil

	stdinW  *os.File
	stdin   chan []byte // a nil slice closes stdin
	outs    []*os.File
	outDone chan struct{}

	cancel     chan struct{}
	cancelOnce sync.Once
	finished   chan struct{} // closed once the process is reaped
}

// exec starts req's process and streams it until it exits.
func (a *Agent) exec(c *conn, id uint32, req proto.ExecRequest) {
	e := &execution{a: a, c: c, id: id, stdin: make(chan []byte, 2*proto.StdinWindow),
		cancel: make(chan struct{}), finished: make(chan struct{})}
	if err := c.register(id, e); err != nil {
		c.fail(id, err)
		return
	}
	done, err := e.start(req)
	if err != nil {
		c.unregister(id)
		if se := (*startError)(nil); !errors.As(err, &se) {
			err = fmt.Errorf("exec %q: %w", req.Argv, err) // a start error names what failed
		}
		c.fail(id, err)
		return
	}
	go e.run(done, req.Timeout)
}

// start forks the process with its pipes or terminal.
func (e *execution) start(req proto.ExecRequest) (<-chan exitStatus, error) {
	if len(req.Argv) == 0 {
		return nil, errors.New("empty argv")
	}
	uid := uint32(0)
	if req.UID != nil {
		uid = *req.UID
	}
	env := withDefaults(req.Env, uid, req.TTY)
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}
	// The directory first, as the child changes into it before the exec
	// (a relative command path is looked up there).
	if st, err := os.Stat(dir); err != nil {
		return nil, &startError{proto.CodeBadDir, fmt.Sprintf("working directory %s: %s", dir, errnoText(err))}
	} else if !st.IsDir() {
		return nil, &startError{proto.CodeBadDir, fmt.Sprintf("working directory %s: not a directory", dir)}
	}
	path, err := lookPath(req.Argv[0], env)
	if err != nil {
		return nil, err
	}
	sys := &syscall.SysProcAttr{Setpgid: true}
	if req.UID != nil || req.GID != nil {
		cred := &syscall.Credential{Groups: []uint32{}}
		if req.UID != nil {
			cred.Uid, cred.Gid = *req.UID, *req.UID
		}
		if req.GID != nil {
			cred.Gid = *req.GID
		}
		sys.Credential = cred
	}
	var child [3]*os.File // closed in the agent once the child has them
	if req.TTY {
		master, slave, err := openPTY(req.Rows, req.Cols)
		if err != nil {
			return nil, err
		}
		child = [3]*os.File{slave, slave, slave}
		e.tty, e.stdinW, e.outs = master, master, []*os.File{master}
		sys.Setpgid, sys.Setsid, sys.Setctty, sys.Ctty = false, true, true, 0
	} else {
		var p [3][2]*os.File
		for i := range p {
			if p[i][0], p[i][1], err = os.Pipe(); err != nil {
				closeAll(p[:i])
				return nil, fmt.Errorf("make pipes: %w", err)
			}
		}
		child = [3]*os.File{p[0][0], p[1][1], p[2][1]}
		e.stdinW, e.outs = p[0][1], []*os.File{p[1][0], p[2][0]}
	}
	defer func() {
		for _, f := range child {
			f.Close()
		}
	}()
	attr := &syscall.ProcAttr{Dir: dir, Env: env, Sys: sys,
		Files: []uintptr{child[0].Fd(), child[1].Fd(), child[2].Fd()}}
	e.a.events.starting()
	_, done, err := e.a.reaper.start(func() (int, error) {
		return syscall.ForkExec(path, req.Argv, attr)
	}, func(pid int) {
		// The caller learns of the start before the process is read for
		// the events stream: nothing of it can come before this frame (its
		// output is copied once start returns, its exit reaped once this
		// returns).
		e.pid = pid
		e.c.sendJSON(proto.KindStarted, e.id, proto.Started{PID: pid})
		e.a.events.started(pid, func() proto.Process {
			p, err := e.a.proc.Process(pid)
			if err != nil || len(p.Argv) == 0 {
				p = proto.Process{PID: pid, PPID: os.Getpid(), Argv: req.Argv, Start: time.Now()}
			}
			return p
		})
	})
	if err != nil {
		e.a.events.startFailed()
		e.stdinW.Close()
		if e.tty == nil {
			closeAll([][2]*os.File{{e.outs[0], e.outs[1]}})
		}
		return nil, startFailure(path, dir, sys.Credential, err)
	}
	e.a.mu.Lock()
	e.a.execs[e] = struct{}{}
	e.a.mu.Unlock()
	go e.feedStdin()
	e.outDone = make(chan struct{}, len(e.outs))
	kinds := []proto.Kind{proto.KindStdout, proto.KindStderr}
	for i, f := range e.outs {
		go e.copyOut(f, kinds[i])
	}
	return done, nil
}

func closeAll(ps [][2]*os.File) {
	for _, p := range ps {
		p[0].Close()
		p[1].Close()
	}
}

// run waits for the process, kills its group on timeout or cancel, drains
// its output and sends its exit.
func (e *execution) run(done <-chan exitStatus, timeout time.Duration) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	cancel, timedOut := e.cancel, false
	var st exitStatus
wait:
	for {
		select {
		case st = <-done:
			break wait
		case <-timer:
			timedOut, timer = true, nil
			e.signal(unix.SIGKILL, true)
		case <-cancel:
			cancel = nil
			e.signal(unix.SIGKILL, true)
		}
	}
	close(e.finished)
	// Output still in the pipes is read to its end; a background child
	// that holds them open is cut off after the grace period.
	grace := time.After(e.a.cfg.OutputGrace)
	for range e.outs {
		select {
		case <-e.outDone:
		case <-grace:
			for _, f := range e.outs {
				f.Close()
			}
			<-e.outDone
		}
	}
	for _, f := range e.outs {
		f.Close()
	}
	e.stdinW.Close()
	e.c.sendJSON(proto.KindExit, e.id, exitOf(st, timedOut))
	e.c.unregister(e.id)
	e.a.mu.Lock()
	delete(e.a.execs, e)
	e.a.mu.Unlock()
}

// exitOf turns a wait status into an Exit.
func exitOf(st exitStatus, timedOut bool) proto.Exit {
	x := proto.Exit{PID: st.pid, Code: st.status.ExitStatus(), TimedOut: timedOut}
	if st.status.Signaled() {
		x.Code, x.Signal = -1, int(st.status.Signal())
	}
	return x
}

// copyOut streams one output of the process to the host. It keeps reading
// after the host went away, so that the process never blocks on output.
func (e *execution) copyOut(f *os.File, k proto.Kind) {
	defer func() { e.outDone <- struct{}{} }()
	buf := make([]byte, proto.ChunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			e.c.send(proto.Frame{Kind: k, ID: e.id, Payload: buf[:n]})
			e.a.events.kick()
		}
		if err != nil {
			return
		}
	}
}

// feedStdin writes the host's stdin frames to the process, acknowledging
// each one, until stdin is closed or the process is gone.
func (e *execution) feedStdin() {
	open := true
	for {
		select {
		case b := <-e.stdin:
			switch {
			case b == nil && e.tty != nil && open:
				e.tty.Write([]byte{4}) // VEOF: the terminal's end of input
			case b == nil && open:
				e.stdinW.Close()
				open = false
			case open:
				if _, err := e.stdinW.Write(b); err != nil {
					open = false // the process closed its input; discard the rest
				}
			}
			if b != nil {
				e.c.send(proto.Frame{Kind: proto.KindAck, ID: e.id})
			}
		case <-e.finished:
			return
		}
	}
}

// frame handles the host's follow-up frames.
func (e *execution) frame(f proto.Frame) {
	switch f.Kind {
	case proto.KindStdin, proto.KindCloseStdin:
		var b []byte
		if f.Kind == proto.KindStdin {
			if len(f.Payload) == 0 {
				return
			}
			b = f.Payload
		}
		select {
		case e.stdin <- b:
		case <-e.finished:
		}
	case proto.KindSignal:
		var s proto.Signal
		if err := proto.Decode(f, &s); err != nil || s.Signal <= 0 || s.Signal > 64 {
			return
		}
		e.signal(unix.Signal(s.Signal), s.Group)
	case proto.KindResize:
		var r proto.Resize
		if e.tty != nil && proto.Decode(f, &r) == nil {
			setWinsize(e.tty, r.Rows, r.Cols)
		}
	case proto.KindCancel:
		e.cancelOnce.Do(func() { close(e.cancel) })
	}
}

// close closes the process's stdin when the host goes away; the process
// keeps running.
func (e *execution) close() {
	select {
	case e.stdin <- nil:
	case <-e.finished:
	}
}

// signal sends sig to the process, or to its whole process group, unless
// it has been reaped (its pid may then belong to another process).
func (e *execution) signal(sig unix.Signal, group bool) {
	select {
	case <-e.finished:
		if !group {
			return
		}
	default:
	}
	pid := e.pid
	if group {
		pid = -pid
	}
	unix.Kill(pid, sig)
}

// lookPath finds a command without a slash in env's PATH.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &startError{proto.CodeNotFound, fmt.Sprintf("%s: command not found (PATH %s)", name, path)}
}

// startError is a command that did not start for a reason the host can
// act on: code is proto.CodeNotFound, CodeNotExecutable or CodeBadDir,
// and msg names the command or the directory.
type startError struct {
	code, msg string
}

func (e *startError) Error() string { return e.msg }

// startFailure is the error of a ForkExec of path in dir, as cred when
// not nil, that failed: a startError where the exec itself failed, as a
// shell tells them apart (ENOENT: not found; anything else: not
// executable), or a plain error where the fork did (no memory, no pids
// left).
func startFailure(path, dir string, cred *syscall.Credential, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("start %s in %s: %w", path, dir, err)
	}
	abs := path
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(dir, abs)
	}
	switch errno {
	case syscall.EAGAIN, syscall.ENOMEM, syscall.ENOSPC, syscall.EINTR, syscall.EMFILE, syscall.ENFILE:
		return fmt.Errorf("start %s in %s: %w", path, dir, err)
	case syscall.ENOENT:
		if st, serr := os.Stat(dir); serr != nil || !st.IsDir() {
			// Removed since it was checked.
			return &startError{proto.CodeBadDir, fmt.Sprintf("working directory %s: no such file or directory", dir)}
		}
		if _, serr := os.Stat(abs); serr == nil {
			return &startError{proto.CodeNotFound, fmt.Sprintf("%s: cannot execute: its interpreter (#! line or ELF loader) is missing", path)}
		}
		return &startError{proto.CodeNotFound, fmt.Sprintf("%s: no such file or directory", path)}
	case syscall.EACCES:
		// The child's chdir, as another user, fails with the same errno
		// as its exec: the mode bits tell which it was.
		if cred != nil && cred.Uid != 0 && !searchable(dir, cred.Uid, cred.Gid) {
			return &startError{proto.CodeBadDir, fmt.Sprintf("working directory %s: permission denied (uid %d, gid %d)", dir, cred.Uid, cred.Gid)}
		}
		if st, serr := os.Stat(abs); serr == nil && st.IsDir() {
			return &startError{proto.CodeNotExecutable, fmt.Sprintf("%s: is a directory", path)}
		}
	}
	return &startError{proto.CodeNotExecutable, fmt.Sprintf("%s: %s", path, errno.Error())}
}

// searchable says whether uid, in group gid and no other, may search dir
// and every directory above it, by their mode bits (ACLs are not read).
func searchable(dir string, uid, gid uint32) bool {
	if !filepath.IsAbs(dir) {
		return true
	}
	p := "/"
	for _, part := range strings.Split(filepath.Clean(dir), "/") {
		p = filepath.Join(p, part)
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil {
			return true // not for this check to say
		}
		bit := st.Mode & 0o001
		switch {
		case st.Uid == uid:
			bit = st.Mode & 0o100
		case st.Gid == gid:
			bit = st.Mode & 0o010
		}
		if bit == 0 {
			return false
		}
	}
	return true
}

// errnoText is the system's text of err's errno ("no such file or
// directory"), or err's whole text when it carries none.
func errnoText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
