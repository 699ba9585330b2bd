package virtio

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"tine/vmm/fuseserver"
)

// envFSRoot, set in a process's environment, makes it a FUSE server of
// that directory on fd 3, with its control socket on fd 4, instead of
// what it was going to be (see LoopbackServer); the package's init does
// it before main. envFSState says that fd 5 holds tables to import.
const (
	envFSRoot  = "TINE_VIRTIOFS_ROOT"
	envFSState = "TINE_VIRTIOFS_STATE"
)

func init() {
	if dir := os.Getenv(envFSRoot); dir != "" {
		// go-fuse logs through the standard logger (an end of the
		// connection is a "short read"): this process is only its server.
		log.SetOutput(io.Discard)
		var state *os.File
		if os.Getenv(envFSState) != "" {
			state = os.NewFile(5, "tables")
		}
		if err := serveShare(dir, 3, 4, state); err != nil {
			fmt.Fprintf(os.Stderr, "virtio-fs server of %s: %v\n", dir, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// LoopbackServer returns an FS.Connect that serves dir on the host, read
// and write, for each session: a new process (this program, run again)
// chroots into dir and runs a fuseserver.Server on its end of a
// SOCK_SEQPACKET pair, taking over the tables Connect is given. The
// chroot keeps the guest's requests inside dir whatever symlinks it makes
// or renames it races; a separate process keeps a server that fails apart
// from the host's. The process ends when the device closes its end (Close
// waits for that, so nothing holds dir afterwards), or with its parent.
func LoopbackServer(dir string) func(tables []byte) (FSConn, error) {
	return func(tables []byte) (FSConn, error) {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("virtio-fs: %s is not a directory (%v)", dir, err)
		}
		dev, srv, err := socketPair(unix.SOCK_SEQPACKET, "virtio-fs")
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		ctl, ctlSrv, err := socketPair(unix.SOCK_STREAM, "virtio-fs control")
		if err != nil {
			dev.Close()
			return nil, err
		}
		defer ctlSrv.Close()
		for _, f := range []*os.File{dev, srv} {
			if rc, err := f.SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) {
					unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
				})
			}
		}
		cmd := exec.Command("/proc/self/exe")
		cmd.Env = []string{envFSRoot + "=" + dir}
		cmd.ExtraFiles = []*os.File{srv, ctlSrv}
		if tables != nil {
			state, err := memFile("virtio-fs tables", tables)
			if err != nil {
				dev.Close()
				ctl.Close()
				return nil, err
			}
			defer state.Close()
			cmd.Env = append(cmd.Env, envFSState+"=1")
			cmd.ExtraFiles = append(cmd.ExtraFiles, state)
		}
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWNS}
		if err := cmd.Start(); err != nil {
			dev.Close()
			ctl.Close()
			return nil, fmt.Errorf("virtio-fs: start the server of %s: %w", dir, err)
		}
		c := &serverConn{File: dev, ctl: ctl, cmd: cmd, done: make(chan struct{})}
		go func() {
			cmd.Wait()
			close(c.done)
		}()
		return c, nil
	}
}

// socketPair returns the two ends of a socket pair of typ; the first
// (the device's) is non-blocking, so that its Close interrupts a Read
// and its deadlines work (the runtime's poller waits instead).
func socketPair(typ int, name string) (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: socketpair: %w", name, err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return os.NewFile(uintptr(fds[0]), name+" device"), os.NewFile(uintptr(fds[1]), name+" server"), nil
}

// memFile returns a memory file holding b, at offset 0.
func memFile(name string, b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return f, nil
}

// serverConn is the device's end of a loopback server's connection.
type serverConn struct {
	*os.File
	ctl  *os.File // the control socket (Export)
	cmd  *exec.Cmd
	done chan struct{}
}

// exportTimeout bounds an Export: the server answers it between
// requests, from tables it holds in memory.
const exportTimeout = 10 * time.Second

// Export implements FSConn: it asks the server for its tables over the
// control socket. The control protocol is one byte 'E', answered by a
// u32 status (0: tables follow; else an error message follows) and a
// u32 length, little-endian, then that many bytes (at most
// MaxDeviceState).
func (c *serverConn) Export() ([]byte, error) {
	c.ctl.SetDeadline(time.Now().Add(exportTimeout))
	if _, err := c.ctl.Write([]byte{'E'}); err != nil {
		return nil, fmt.Errorf("virtio-fs: export: %w", err)
	}
	var h [8]byte
	if _, err := io.ReadFull(c.ctl, h[:]); err != nil {
		return nil, fmt.Errorf("virtio-fs: export: %w", err)
	}
	status, n := le.Uint32(h[:]), le.Uint32(h[4:])
	if n > MaxDeviceState {
		return nil, fmt.Errorf("virtio-fs: export: the server sent %d bytes, at most %d", n, MaxDeviceState)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c.ctl, b); err != nil {
		return nil, fmt.Errorf("virtio-fs: export: %w", err)
	}
	if status != 0 {
		return nil, fmt.Errorf("virtio-fs: export: %s", b)
	}
	return b, nil
}

// Close closes the connection and waits for the server process to end
// (it ends on the hangup; after serverExitWait it is killed). A process
// the kill does not end within serverExitWait either (stuck in the
// kernel, on the file system it serves) is left, with an error: Close
// returns.
func (c *serverConn) Close() error {
	err := c.File.Close()
	c.ctl.Close()
	select {
	case <-c.done:
	case <-time.After(serverExitWait):
		c.cmd.Process.Kill()
		select {
		case <-c.done:
		case <-time.After(serverExitWait):
			err = errors.Join(err, fmt.Errorf("virtio-fs: the server process %d did not end %v after it was killed; left running", c.cmd.Process.Pid, serverExitWait))
		}
	}
	return err
}

// serverExitWait is how long Close waits for the server process to end
// after the hangup, then after the kill.
var serverExitWait = 5 * time.Second

// serveControl answers Export requests on the control socket fd until
// it closes.
func serveControl(fd int, srv *fuseserver.Server) {
	f := os.NewFile(uintptr(fd), "control")
	var req [1]byte
	for {
		if _, err := io.ReadFull(f, req[:]); err != nil {
			return
		}
		status, b := uint32(0), []byte(nil)
		if req[0] != 'E' {
			status, b = 1, []byte(fmt.Sprintf("unknown request %q", req[0]))
		} else if tables, err := srv.Export(); err != nil {
			status, b = 1, []byte(err.Error())
		} else {
			b = tables
		}
		h := le.AppendUint32(le.AppendUint32(nil, status), uint32(len(b)))
		if _, err := f.Write(h); err != nil {
			return
		}
		if _, err := f.Write(b); err != nil {
			return
		}
	}
}

// exitOnHangup ends the process once the device's end of the connection
// is shut down or closed: go-fuse's Serve also waits for its handlers,
// and one the guest blocked (an open of a FIFO, a lock wait) would keep
// the process after its session, one more for each mount.
func exitOnHangup(fd int) {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		if _, err := unix.Poll(p, -1); err != nil && err != unix.EINTR {
			os.Exit(1)
		}
		if p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
			os.Exit(0)
		}
	}
}

// serveShare chroots into dir and serves it on fd until the other end
// closes, answering Export on the control socket ctl; it first imports
// the tables in state, when given. It runs in a mount namespace of its
// own, where dir is bound onto itself nodev and nosuid: a device node the
// guest makes (or finds) in dir is never a host device to the server.
// That namespace starts as a copy of the host's, and every mount in it
// that dir does not need is detached (detachOthers).
func serveShare(dir string, fd, ctl int, state *os.File) error {
	var tables []byte
	if state != nil {
		b, err := io.ReadAll(io.LimitReader(state, fuseserver.MaxState+1))
		state.Close()
		if err != nil {
			return fmt.Errorf("read the tables to import: %w", err)
		}
		tables = b
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("private mounts: %w", err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("remount %s nodev: %w", dir, err)
	}
	// The bound directory is held open across the detaching, so that
	// the chroot reaches it whatever was detached.
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	if err := detachOthers(dir); err != nil {
		return err
	}
	if err := unix.Fchdir(root); err != nil {
		return fmt.Errorf("enter %s: %w", dir, err)
	}
	unix.Close(root)
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	// A descriptor per open file of the guest's: take the hard limit.
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	}
	go exitOnHangup(fd)
	srv, err := fuseserver.New("/")
	if err != nil {
		return err
	}
	if tables != nil {
		if err := srv.Import(tables); err != nil {
			return fmt.Errorf("import the parent's tables: %w", err)
		}
	}
	go serveControl(ctl, srv)
	opts := fuse.MountOptions{
		MaxWrite:             1 << 20,
		DisableSplice:        true,
		DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		Logger:               log.New(io.Discard, "", 0),
		PanicHandler:         func(any) fuse.Status { return fuse.EIO },
	}
	fsrv, err := fuse.NewServer(srv, fmt.Sprintf("/dev/fd/%d", fd), &opts)
	if err != nil {
		return err
	}
	fsrv.Serve()
	return nil
}

// detachOthers lazily unmounts, in the server's mount namespace, every
// mount that is neither dir, nor above it, nor below it. The namespace is
// a private copy of the host's made when the server started, and each
// mount in it keeps its file system alive as long as the server runs: a
// FUSE mount the host unmounts (another sandbox's project branch, whose
// server waits until its last mount is gone) would otherwise wait for
// this server to end.
func detachOthers(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("list mounts: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	// Children come after their parents in mountinfo: detach the last
	// first. A mount detached with its parent already answers EINVAL.
	for i := len(lines) - 1; i >= 0; i-- {
		mp, ok := mountPoint(lines[i])
		if !ok || mp == "/" || within(dir, mp) || within(mp, dir) {
			continue
		}
		unix.Unmount(mp, unix.MNT_DETACH)
	}
	return nil
}

// mountPoint returns the mount point of a mountinfo line
// (ID PARENT MAJ:MIN ROOT MOUNTPOINT ...), its octal escapes undone.
func mountPoint(line string) (string, bool) {
	f := strings.Split(line, " ")
	if len(f) < 5 {
		return "", false
	}
	s := f[4]
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				out.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		out.WriteByte(s[i])
	}
	return out.String(), true
}

// within says whether path p is dir or below it.
func within(dir, p string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}
