package api

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrRunning reports a state root that a live daemon already serves.
var ErrRunning = errors.New("a tine daemon already serves this state root")

// Listener is the daemon's socket: it accepts only connections from root,
// the daemon's own user and members of its group. Listen returns one.
type Listener struct {
	ln   *net.UnixListener
	path string
	lock *os.File
	uid  uint32
	gid  int // -1: no group may connect
	note string
	ino  uint64
}

// Listen listens on root/tine.sock for the daemon. The socket is bound
// under a temporary name, given mode 0660 and group group, and only then
// renamed into place, so it is never reachable with looser permissions.
// When group does not exist the socket is 0600 and Note says so. A socket
// left by a daemon that died is replaced; one that a live daemon serves
// is not (ErrRunning, naming its pid when it can be told).
func Listen(root, group string) (net.Listener, error) {
	p := filepath.Join(root, SocketName)
	lock, err := os.OpenFile(p+".lock", os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("daemon socket: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, runningError(p)
		}
		return nil, fmt.Errorf("daemon socket: lock %s: %w", p+".lock", err)
	}
	l := &Listener{path: p, lock: lock, uid: uint32(os.Geteuid()), gid: -1}
	fail := func(err error) (net.Listener, error) {
		lock.Close()
		return nil, err
	}
	// With the lock held no other daemon serves p, but one that does not
	// take the lock could: ask before removing what is there.
	if st, err := os.Lstat(p); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return fail(fmt.Errorf("daemon socket: %s exists and is not a socket; move it away", p))
		}
		if c, err := net.Dial("unix", p); err == nil {
			c.Close()
			return fail(runningError(p))
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fail(fmt.Errorf("daemon socket: remove the stale %s: %w", p, err))
		}
	}
	mode := os.FileMode(0o600)
	if g, err := user.LookupGroup(group); err == nil {
		if gid, err := strconv.Atoi(g.Gid); err == nil {
			l.gid, mode = gid, 0o660
		}
	}
	if l.gid < 0 {
		l.note = fmt.Sprintf("group %q does not exist: %s is 0600, for its owner and root only; create the group (groupadd %s) and restart to share it", group, p, group)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", p, os.Getpid())
	os.Remove(tmp)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return fail(fmt.Errorf("daemon socket: listen on %s: %w", tmp, err))
	}
	ln.SetUnlinkOnClose(false)
	err = os.Chmod(tmp, mode)
	if err == nil && l.gid >= 0 {
		err = os.Lchown(tmp, -1, l.gid)
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	var st os.FileInfo
	if err == nil {
		st, err = os.Lstat(p)
	}
	if err != nil {
		ln.Close()
		os.Remove(tmp)
		return fail(fmt.Errorf("daemon socket %s: %w", p, err))
	}
	l.ino = st.Sys().(*syscall.Stat_t).Ino
	l.ln = ln
	return l, nil
}

// runningError names the live daemon serving socket p.
func runningError(p string) error {
	if pid := serverPID(p); pid > 0 {
		return fmt.Errorf("%w: pid %d serves %s; stop it first (or use another state root)", ErrRunning, pid, p)
	}
	return fmt.Errorf("%w: %s is in use; stop the daemon first (or use another state root)", ErrRunning, p)
}

// DaemonPID returns the pid of the daemon answering on root's socket, or 0
// when none answers.
func DaemonPID(root string) int { return serverPID(filepath.Join(root, SocketName)) }

// serverPID returns the pid of the process that listens on socket p, or 0.
func serverPID(p string) int {
	c, err := net.Dial("unix", p)
	if err != nil {
		return 0
	}
	defer c.Close()
	cred, err := peerCred(c.(*net.UnixConn))
	if err != nil {
		return 0
	}
	return int(cred.Pid)
}

// Note says how the socket's permissions differ from what was asked, or "".
func (l *Listener) Note() string { return l.note }

// Addr is the socket's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Accept returns the next connection from an allowed peer; connections
// from others are closed unanswered.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if l.allowed(c) {
			return c, nil
		}
		c.Close()
	}
}

// Close stops listening and removes the socket if it is still this one.
func (l *Listener) Close() error {
	err := l.ln.Close()
	if st, serr := os.Lstat(l.path); serr == nil && st.Sys().(*syscall.Stat_t).Ino == l.ino {
		os.Remove(l.path)
	}
	l.lock.Close()
	return err
}

// allowed says whether the peer is root, the daemon's user, or in its
// group (as primary or supplementary group at connect time).
func (l *Listener) allowed(c *net.UnixConn) bool {
	cred, err := peerCred(c)
	if err != nil {
		return false
	}
	var groups []uint32
	if l.gid >= 0 && cred.Uid != 0 && cred.Uid != l.uid && cred.Gid != uint32(l.gid) {
		groups, _ = peerGroups(c)
	}
	return peerAllowed(cred.Uid, cred.Gid, groups, l.uid, l.gid)
}

// peerAllowed is the rule allowed applies.
func peerAllowed(uid, gid uint32, groups []uint32, self uint32, group int) bool {
	if uid == 0 || uid == self {
		return true
	}
	if group < 0 {
		return false
	}
	if gid == uint32(group) {
		return true
	}
	for _, g := range groups {
		if g == uint32(group) {
			return true
		}
	}
	return false
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// peerGroups returns the peer's supplementary groups (SO_PEERGROUPS).
func peerGroups(c *net.UnixConn) ([]uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	groups := make([]uint32, 256)
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		for {
			size := uint32(len(groups) * 4)
			_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_PEERGROUPS,
				uintptr(unsafe.Pointer(&groups[0])), uintptr(unsafe.Pointer(&size)), 0)
			if e == unix.ERANGE && len(groups) < 1<<16 {
				groups = make([]uint32, max(int(size/4), 2*len(groups)))
				continue
			}
			if e != 0 {
				cerr = e
			} else {
				groups = groups[:size/4]
			}
			return
		}
	}); err != nil {
		return nil, err
	}
	return groups, cerr
}
