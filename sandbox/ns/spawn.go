package ns

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"tine/internal/nsinit"
	"tine/internal/strayfd"
)

// The spawner starts init steps in new user namespaces for this program
// (docs/adr/0193). Go's os/exec cannot start a child in a new user
// namespace with vfork: it forks the whole process, copying its page
// tables, and each page this program writes afterwards faults once
// more (copy on write). With a daemon's heap that cost 11–15 ms a start
// on the 2-core PVM hosts, against 1.5–3 ms with vfork. The spawner, a
// second run of this program started once with vfork, stays small, so
// its forks are cheap. It runs no sandbox code: it forks and executes
// the agent binary as the init step (package nsinit), as Start would,
// and hands back a pidfd. Its start costs 5–8 ms here whatever the
// spawner's size: the new user namespace and its maps, not the fork,
// are most of it (ADR 0195).
//
// Its protocol, on a SEQPACKET socket: a request is a spawnRequest with
// three descriptors (the log's write end, the init's control socket, the
// agent's listening socket: the child's fd 1 and 2, 3, and 4); the reply
// is a spawnReply with the child's pidfd when it started. It reaps its
// children; the caller learns of an exit from the pidfd. It dies with
// this program (Pdeathsig), and its children with it.

// modeSpawn is initEnv's value for the spawner.
const modeSpawn = "spawn"

// spawnRequest asks the spawner to start one init step.
type spawnRequest struct {
	// Path is the program to run: the spawner opens it and executes it
	// through that descriptor, which the new user namespace's root can
	// do where it may not search the program's directory.
	Path       string
	Args, Env  []string
	Cloneflags uintptr
	// Base and Size are the user namespace's mapping (idMap).
	Base, Size uint32
}

// spawnReply answers a spawnRequest.
type spawnReply struct {
	Pid int    `json:",omitempty"`
	Err string `json:",omitempty"`
}

// spawnFDs is how many descriptors come with a request.
const spawnFDs = 3

// theSpawner serves every runtime of this process.
var theSpawner spawner

// spawner is this program's handle on its spawner process.
type spawner struct {
	mu   sync.Mutex
	conn *os.File // nil until started, and after it failed
}

// spawn starts an init step with args and env in new namespaces
// (cloneflags, CLONE_NEWUSER among them) with mapping m, its fd 1 and 2
// on log, 3 on ctl and 4 on lis. It returns the child's pid and a pidfd.
// A spawner found dead is started again once.
func (s *spawner) spawn(req spawnRequest, log, ctl, lis *os.File) (int, *os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return 0, nil, err
	}
	fds := []int{int(log.Fd()), int(ctl.Fd()), int(lis.Fd())}
	for try := 0; ; try++ {
		if s.conn == nil {
			if s.conn, err = startSpawner(); err != nil {
				return 0, nil, err
			}
		}
		pid, pidfd, err := s.ask(b, fds)
		if err == nil || try == 1 || !errors.Is(err, errSpawnerGone) {
			return pid, pidfd, err
		}
		s.conn.Close()
		s.conn = nil
	}
}

// errSpawnerGone marks a failure to reach the spawner process.
var errSpawnerGone = errors.New("the spawner process is gone")

// ask sends one request and reads its reply.
func (s *spawner) ask(req []byte, fds []int) (int, *os.File, error) {
	fd := int(s.conn.Fd())
	if err := unix.Sendmsg(fd, req, unix.UnixRights(fds...), nil, 0); err != nil {
		return 0, nil, fmt.Errorf("%w: %v", errSpawnerGone, err)
	}
	b, got, err := nsinit.ReadMessage(fd)
	if err != nil {
		nsinit.CloseAll(got)
		return 0, nil, fmt.Errorf("%w: %v", errSpawnerGone, err)
	}
	var r spawnReply
	if err := json.Unmarshal(b, &r); err != nil {
		nsinit.CloseAll(got)
		return 0, nil, fmt.Errorf("spawner reply: %w", err)
	}
	if r.Err != "" || len(got) != 1 || r.Pid <= 0 {
		nsinit.CloseAll(got)
		if r.Err == "" {
			r.Err = fmt.Sprintf("reply with pid %d and %d descriptors, want a pid and one", r.Pid, len(got))
		}
		return 0, nil, errors.New(r.Err)
	}
	return r.Pid, os.NewFile(uintptr(got[0]), "pidfd"), nil
}

// startSpawner runs this program as the spawner, with vfork (no new
// namespace), and returns this end of its socket.
func startSpawner() (*os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner socket: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "spawner")
	defer child.Close()
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{"tine-spawner"}, Env: []string{initEnv + "=" + modeSpawn},
		ExtraFiles: []*os.File{child}, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}}
	if err := cmd.Start(); err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("start the spawner: %w", err)
	}
	go cmd.Wait()
	return os.NewFile(uintptr(fds[0]), "spawner"), nil
}

// runSpawner serves requests on fd 3 until this program's end of it
// closes.
func runSpawner() {
	// Pdeathsig of the children is tied to the thread that forks them:
	// this one, for as long as the process lives.
	runtime.LockOSThread()
	// It lives as long as this program: a descriptor it inherited by
	// accident (a mount's, say) would stay open as long.
	strayfd.Close(4)
	for {
		b, fds, err := nsinit.ReadMessage(3)
		if err == io.EOF || errors.Is(err, unix.ECONNRESET) {
			return
		}
		var r spawnReply
		pidfd := -1
		if err != nil {
			r.Err = fmt.Sprintf("spawner: read request: %v", err)
		} else {
			r.Pid, pidfd, err = spawnOne(b, fds)
			if err != nil {
				r.Err = err.Error()
			}
		}
		out, _ := json.Marshal(r)
		var oob []byte
		if pidfd >= 0 {
			oob = unix.UnixRights(pidfd)
		}
		err = unix.Sendmsg(3, out, oob, nil, 0)
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		if err != nil {
			return
		}
	}
}

// spawnOne starts the child a request describes and returns its pid and
// a pidfd; it closes fds.
func spawnOne(b []byte, fds []int) (int, int, error) {
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "passed")
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var req spawnRequest
	if err := json.Unmarshal(b, &req); err != nil {
		return 0, -1, fmt.Errorf("spawner: request: %w", err)
	}
	if len(files) != spawnFDs || len(req.Args) == 0 || req.Cloneflags&syscall.CLONE_NEWUSER == 0 || req.Size == 0 {
		return 0, -1, fmt.Errorf("spawner: request with %d descriptors, %d args, flags %#x, mapping size %d", len(files), len(req.Args), req.Cloneflags, req.Size)
	}
	exe, err := os.Open(req.Path)
	if err != nil {
		return 0, -1, fmt.Errorf("spawner: %w", err)
	}
	defer exe.Close()
	// The program's descriptor follows the passed ones: fd 5 in the
	// child, which the init step marks close-on-exec.
	cmd := &exec.Cmd{Path: "/proc/self/fd/5", Args: req.Args, Env: req.Env,
		Stdout: files[0], Stderr: files[0], ExtraFiles: []*os.File{files[1], files[2], exe},
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: req.Cloneflags, Pdeathsig: syscall.SIGKILL}}
	(&idMap{base: req.Base, size: req.Size}).usernsAttr(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		return 0, -1, fmt.Errorf("run the init step: %w", err)
	}
	// Not reaped before Wait: the pid names the child until then.
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	go cmd.Wait()
	if err != nil {
		cmd.Process.Kill()
		return 0, -1, fmt.Errorf("pidfd of the init step: %w", err)
	}
	return cmd.Process.Pid, pidfd, nil
}

// waitPidfd blocks until the process of pidfd has ended.
func waitPidfd(pidfd *os.File) {
	fds := []unix.PollFd{{Fd: int32(pidfd.Fd()), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != unix.EINTR {
			return
		}
	}
}
