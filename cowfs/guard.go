package cowfs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"tine/internal/strayfd"
)

// A FUSE server that is killed while one of its own threads waits for an
// answer from one of its own mounts never finishes dying: the kernel
// waits, uninterruptibly, for an answer to a request already handed to the
// server, and the server's descriptors, which would end the connection,
// are released only when that last thread exits. The process stays an
// unkillable zombie holding the state root's lock, and every access to
// its mounts hangs. The daemon reads its own mounts (go-fuse's WaitMount
// polls a file of every new mount, for one), so a kill at the wrong
// moment is enough.
//
// The guard is a small process, this program again, started by
// StartGuard. It learns the FUSE connection of each mount this process
// serves, and when this process dies it aborts them through the FUSE
// control filesystem (/sys/fs/fuse/connections/N/abort): the waiting
// request fails, the process ends, and the next Open detaches the dead
// mounts. It needs root (or the mounts' owner) and the control filesystem,
// which it mounts if it is missing.

// guardEnv marks a process started as the guard; its value is the pid of
// the process it guards.
const guardEnv = "TINE_FUSE_GUARD"

// guardSignal is the guard's parent-death signal: one whose default
// action is to ignore it, so that one sent while the guard is still
// starting does not end it (its poll of the parent then notices).
const guardSignal = syscall.SIGCHLD

// guardReady is what the guard says on fd 4 once it is set up.
const guardReady = "tine-fuse-guard ready"

// guardStartTimeout bounds the wait for it.
const guardStartTimeout = 10 * time.Second

// fusectl is where the FUSE control filesystem is mounted.
const fusectl = "/sys/fs/fuse/connections"

// guard is this process's guard, if one was started.
var guard struct {
	mu sync.Mutex
	w  *os.File // the guard's end of the pipe; nil while no guard runs
}

// GuardMain runs the guard and exits when this process was started as one
// by StartGuard; otherwise it returns at once. Programs that call
// StartGuard call GuardMain first thing in main.
func GuardMain() {
	if v, ok := os.LookupEnv(guardEnv); ok {
		os.Exit(runGuard(v))
	}
}

// StartGuard starts this process's guard, once; later calls do nothing.
// Mounts made before it are not guarded.
func StartGuard() error {
	guard.mu.Lock()
	defer guard.mu.Unlock()
	if guard.w != nil {
		return nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("start the FUSE guard: %w", err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("start the FUSE guard: %w", err)
	}
	defer readyR.Close()
	started := make(chan error, 1)
	go func() {
		// The kernel sends the guard its parent-death signal when the
		// thread that started it ends: this thread stays locked to a
		// goroutine that never returns while the guard runs, so the
		// signal comes when the whole process dies.
		runtime.LockOSThread()
		cmd := exec.Command("/proc/self/exe")
		cmd.Args = []string{"tine-fuse-guard"}
		cmd.Env = []string{guardEnv + "=" + strconv.Itoa(os.Getpid())}
		cmd.Stderr = os.Stderr
		cmd.ExtraFiles = []*os.File{r, readyW}
		// Its own process group: a Ctrl-C meant for this process must not
		// end the guard first.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: guardSignal, Setpgid: true}
		err := cmd.Start()
		r.Close()
		readyW.Close()
		started <- err
		if err == nil {
			cmd.Wait()
		}
	}()
	err = <-started
	if err == nil {
		// The guard writes guardReady once its signals are set up: a mount
		// made after this is guarded. A program that does not call
		// GuardMain says nothing of the kind.
		readyR.SetReadDeadline(time.Now().Add(guardStartTimeout))
		b, rerr := io.ReadAll(io.LimitReader(readyR, int64(len(guardReady))+1))
		if string(b) != guardReady {
			err = fmt.Errorf("it did not say it was ready (%v): does this program call cowfs.GuardMain first in main?", rerr)
		}
	}
	if err != nil {
		w.Close() // a guard that did start sees the pipe end, and ends
		return fmt.Errorf("start the FUSE guard: %w", err)
	}
	guard.w = w
	return nil
}

// guardTell sends the guard one line, if a guard runs. A guard that is
// gone makes the write fail, which is ignored: there is nothing to do
// about it but carry on unguarded.
func guardTell(line string) {
	guard.mu.Lock()
	defer guard.mu.Unlock()
	if guard.w != nil {
		guard.w.WriteString(line + "\n")
	}
}

// guardAdd tells the guard of connection id, mounted with source fsName.
func guardAdd(id uint32, fsName string) {
	guardTell("+" + strconv.FormatUint(uint64(id), 10) + " " + fsName)
}

// guardRemove tells the guard that connection id ended (0: none).
func guardRemove(id uint32) {
	if id == 0 {
		return
	}
	guardTell("-" + strconv.FormatUint(uint64(id), 10))
}

// guarded reports whether a guard runs.
func guarded() bool {
	guard.mu.Lock()
	defer guard.mu.Unlock()
	return guard.w != nil
}

// runGuard is the guard: it says it is ready on fd 4, keeps the
// connections it is told of (fd 3) and aborts them once the process with
// pid parent is dying with the pipe still open. It ends without aborting
// anything when the pipe ends: the parent's descriptors are closed, and
// its connections ended with them.
func runGuard(parent string) int {
	ppid, err := strconv.Atoi(parent)
	if err != nil {
		return 2
	}
	// It lives as long as the process it guards: a descriptor it
	// inherited by accident (a mount's, say) would stay open as long.
	strayfd.Close(5)
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGTERM)
	term := make(chan os.Signal, 1)
	signal.Notify(term, guardSignal)
	ready := os.NewFile(4, "ready")
	ready.WriteString(guardReady)
	ready.Close()
	var mu sync.Mutex
	conns := map[uint32]string{}
	eof := make(chan struct{})
	go func() {
		defer close(eof)
		sc := bufio.NewScanner(os.NewFile(3, "guard"))
		for sc.Scan() {
			line := sc.Text()
			if len(line) < 2 {
				continue
			}
			id, name, _ := strings.Cut(line[1:], " ")
			n, err := strconv.ParseUint(id, 10, 32)
			if err != nil {
				continue
			}
			mu.Lock()
			if line[0] == '+' {
				conns[uint32(n)] = name
			} else {
				delete(conns, uint32(n))
			}
			mu.Unlock()
		}
	}()
	// The parent may have died before the handler was in place, and the
	// signal may come before its main thread has ended: look every
	// second, and often once a signal came.
	wait := time.Second
	for !dying(ppid) {
		select {
		case <-eof:
			return 0
		case <-term:
			wait = 10 * time.Millisecond
		case <-time.After(wait):
		}
	}
	// The parent's descriptors are closed when its last thread ends: once
	// the pipe ends, its connections have ended with them (and their
	// numbers may serve other mounts already). A parent whose pipe stays
	// open is stuck: abort what it served. (The wait also lets the reader
	// take what the parent wrote last.)
	select {
	case <-eof:
		return 0
	case <-time.After(100 * time.Millisecond):
	}
	mu.Lock()
	defer mu.Unlock()
	abortConns(conns)
	return 0
}

// dying reports whether process pid is gone or a zombie (its main thread
// ended; other threads may still be stuck).
func dying(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// abortConns aborts each connection that is still mounted with the source
// it was registered with (a number freed since may name another program's
// mount).
func abortConns(conns map[uint32]string) {
	if len(conns) == 0 {
		return
	}
	all, err := readMountinfo()
	if err != nil {
		fmt.Fprintf(os.Stderr, "tine-fuse-guard: %v\n", err)
		return
	}
	mounted := map[uint32]string{}
	for _, e := range all {
		if e.fsType == fuseType {
			mounted[e.minor] = e.source
		}
	}
	if _, err := os.Stat(fusectl + "/."); err == nil {
		if ents, _ := os.ReadDir(fusectl); len(ents) == 0 {
			syscall.Mount("fusectl", fusectl, "fusectl", 0, "")
		}
	}
	for id, name := range conns {
		if mounted[id] != name {
			continue
		}
		p := fusectl + "/" + strconv.FormatUint(uint64(id), 10) + "/abort"
		if err := os.WriteFile(p, []byte("1"), 0); err != nil {
			fmt.Fprintf(os.Stderr, "tine-fuse-guard: abort the FUSE connection of %s: %v\n", name, err)
		}
	}
}
