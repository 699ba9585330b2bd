package virtio

import (
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

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// envFSRoot, set in a process's environment, makes it a loopback FUSE
// server of that directory on fd 3 instead of what it was going to be
// (see LoopbackServer); the package's init does it before main.
const envFSRoot = "TINE_VIRTIOFS_ROOT"

func init() {
	if dir := os.Getenv(envFSRoot); dir != "" {
		// go-fuse logs through the standard logger (an end of the
		// connection is a "short read"): this process is only its server.
		log.SetOutput(io.Discard)
		if err := serveLoopback(dir, 3); err != nil {
			fmt.Fprintf(os.Stderr, "virtio-fs server of %s: %v\n", dir, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// LoopbackServer returns an FS.Connect that serves dir on the host, read
// and write, for each session: a new process (this program, run again)
// chroots into dir and runs go-fuse's loopback file system on its end of
// a SOCK_SEQPACKET pair. The chroot keeps the guest's requests inside dir
// whatever symlinks it makes or renames it races (the loopback works on
// paths); a separate process keeps a server that fails apart from the
// host's. The process ends when the device closes its end (Close waits
// for that, so nothing holds dir afterwards), or with its parent.
func LoopbackServer(dir string) func() (io.ReadWriteCloser, error) {
	return func() (io.ReadWriteCloser, error) {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("virtio-fs: %s is not a directory (%v)", dir, err)
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("virtio-fs: socketpair: %w", err)
		}
		// The device's end is non-blocking, so that its Close interrupts
		// a Read (the runtime's poller waits instead).
		if err := unix.SetNonblock(fds[0], true); err != nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
			return nil, fmt.Errorf("virtio-fs: %w", err)
		}
		dev, srv := os.NewFile(uintptr(fds[0]), "virtio-fs device"), os.NewFile(uintptr(fds[1]), "virtio-fs server")
		defer srv.Close()
		for _, f := range []*os.File{dev, srv} {
			if rc, err := f.SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) {
					unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
				})
			}
		}
		cmd := exec.Command("/proc/self/exe")
		cmd.Env = []string{envFSRoot + "=" + dir}
		cmd.ExtraFiles = []*os.File{srv}
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWNS}
		if err := cmd.Start(); err != nil {
			dev.Close()
			return nil, fmt.Errorf("virtio-fs: start the server of %s: %w", dir, err)
		}
		c := &serverConn{File: dev, cmd: cmd, done: make(chan struct{})}
		go func() {
			cmd.Wait()
			close(c.done)
		}()
		return c, nil
	}
}

// serverConn is the device's end of a loopback server's connection.
type serverConn struct {
	*os.File
	cmd  *exec.Cmd
	done chan struct{}
}

// Close closes the connection and waits for the server process to end
// (it ends on the hangup; after 5 s it is killed).
func (c *serverConn) Close() error {
	err := c.File.Close()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
	return err
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

// serveLoopback chroots into dir and serves it on fd until the other end
// closes. It runs in a mount namespace of its own, where dir is bound
// onto itself nodev and nosuid: a device node the guest makes (or finds)
// in dir is never a host device to the server. That namespace starts as
// a copy of the host's, and every mount in it that dir does not need is
// detached (detachOthers).
func serveLoopback(dir string, fd int) error {
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
	go exitOnHangup(fd)
	lroot, err := fs.NewLoopbackRoot("/")
	if err != nil {
		return err
	}
	sec := time.Second
	opts := &fs.Options{EntryTimeout: &sec, AttrTimeout: &sec, MountOptions: fuse.MountOptions{
		MaxWrite:             1 << 20,
		DisableSplice:        true,
		DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		Logger:               log.New(io.Discard, "", 0),
		PanicHandler:         func(any) fuse.Status { return fuse.EIO },
	}}
	srv, err := fuse.NewServer(fs.NewNodeFS(lroot, opts), fmt.Sprintf("/dev/fd/%d", fd), &opts.MountOptions)
	if err != nil {
		return err
	}
	srv.Serve()
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
