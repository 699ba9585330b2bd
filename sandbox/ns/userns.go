package ns

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"tine/internal/nsinit"
)

// User namespaces (docs/adr/0095). Where the host allows it, each sandbox
// runs in a user namespace that maps its uids and gids 0..idSize-1 to the
// host's idBase..idBase+idSize-1: root in a sandbox is an unprivileged
// host user, whose capabilities count only inside the sandbox and only
// for files whose owners are mapped.
//
// The files keep their host owners on disk. The sandbox sees them through
// idmapped mounts made with the same mapping: the host root (the
// overlay's lower layer), the sandbox's state directory (its upper
// layer), and the project's cowfs mount. The host builds the overlay over
// those (so overlayfs keeps its trusted.* attributes, and a layer's files
// are owned as in a sandbox without a user namespace: copies, diffs and
// forks work unchanged) and hands the init step the mount, which the init
// step, already in the new user namespace, attaches and builds on.

// Default mapping: 65536 ids above systemd's container range
// (524288..1879048191), unless /etc/subuid and /etc/subgid name a range
// for the user "tine".
const (
	idBase = 0x70000000
	idSize = 65536
)

// idMap is the runtime's user namespace setup: the mapping, a user
// namespace holding it (for mount_setattr), and an idmapped clone of
// the host root.
type idMap struct {
	base, size uint32
	userns     int // a user namespace with the mapping
	lower      int // the host root, idmapped
}

// modeHold is initEnv's value for the process that holds a user namespace
// with the mapping while the host opens it, and checks on the way that
// proc and sysfs can be mounted inside (see holdUserns).
const modeHold = "hold"

// usernsSetup returns the runtime's user namespace setup, made once, or
// nil and why sandboxes run without one.
func (r *Runtime) usernsSetup() (*idMap, error) {
	r.idOnce.Do(func() {
		if r.noUserns {
			r.idErr = errors.New("turned off")
			return
		}
		if Rootless() {
			r.idErr = errors.New("rootless mode: sandboxes share the daemon's user namespace, where root is the user who started it")
			return
		}
		r.ids, r.idErr = newIDMap()
	})
	return r.ids, r.idErr
}

// UseUserns turns user namespaces off (false) for the sandboxes this
// runtime starts from now on; by default they are used where the host
// allows. It has effect only before the first Start.
func (r *Runtime) UseUserns(on bool) { r.noUserns = !on }

// Userns says whether this runtime's sandboxes run in a user namespace,
// the mapping if so ("0:BASE:SIZE"), and why not otherwise.
func (r *Runtime) Userns() (bool, string) {
	m, err := r.usernsSetup()
	if err != nil {
		return false, err.Error()
	}
	return true, fmt.Sprintf("sandbox uids and gids 0..%d are host %d..%d", m.size-1, m.base, m.base+m.size-1)
}

// newIDMap makes the user namespace setup, or says why the host does not
// allow it.
func newIDMap() (*idMap, error) {
	if rel, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil && !kernelAtLeast(string(rel), 6, 12) {
		return nil, fmt.Errorf("Linux %s cannot idmap the project's FUSE mount (6.12 and later can)", strings.TrimSpace(string(rel)))
	}
	base, size := idRange()
	ufd, err := holdUserns(base, size)
	if err != nil {
		return nil, err
	}
	m := &idMap{base: base, size: size, userns: ufd, lower: -1}
	if m.lower, err = m.clone("/"); err != nil {
		unix.Close(ufd)
		return nil, fmt.Errorf("the host root file system does not take idmapped mounts: %w", err)
	}
	return m, nil
}

// idRange reads the range of the user "tine" from /etc/subuid and
// /etc/subgid, where both have one of at least idSize ids starting at the
// same id, and returns the default otherwise.
func idRange() (uint32, uint32) {
	u, us := subRange("/etc/subuid")
	g, gs := subRange("/etc/subgid")
	if u != 0 && u == g && us >= idSize && gs >= idSize {
		return u, idSize
	}
	return idBase, idSize
}

func subRange(path string) (uint32, uint32) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		p := strings.Split(strings.TrimSpace(s.Text()), ":")
		if len(p) != 3 || p[0] != "tine" {
			continue
		}
		b, err1 := strconv.ParseUint(p[1], 10, 32)
		n, err2 := strconv.ParseUint(p[2], 10, 32)
		if err1 == nil && err2 == nil && b > 0 && b+n <= 1<<32-1 {
			return uint32(b), uint32(n)
		}
	}
	return 0, 0
}

// usernsAttr returns the process attributes that start a process in a
// new user namespace with the mapping, as its root.
func (m *idMap) usernsAttr(a *syscall.SysProcAttr) {
	a.Cloneflags |= syscall.CLONE_NEWUSER
	a.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.base), Size: int(m.size)}}
	a.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.base), Size: int(m.size)}}
	a.GidMappingsEnableSetgroups = true
	a.Credential = &syscall.Credential{Uid: 0, Gid: 0}
}

// holdUserns starts this program in new user, mount, pid and network
// namespaces with the mapping, where it mounts proc and sysfs (which a
// sandbox needs and which some hosts forbid: a masked /proc), and returns
// a descriptor of its user namespace.
func holdUserns(base, size uint32) (int, error) {
	m := &idMap{base: base, size: size}
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{"tine-userns"}, Env: []string{initEnv + "=" + modeHold}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET,
		Pdeathsig:  syscall.SIGKILL,
	}
	m.usernsAttr(cmd.SysProcAttr)
	in, err := cmd.StdinPipe()
	if err != nil {
		return -1, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return -1, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("start a process in a new user namespace: %w", err)
	}
	defer func() {
		in.Close()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if line = strings.TrimSpace(line); line != "ok" {
		if line == "" {
			line = fmt.Sprint(err, " ", strings.TrimSpace(stderr.String()))
		}
		return -1, fmt.Errorf("in a new user namespace: %s", line)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the new user namespace: %w", err)
	}
	return fd, nil
}

// runHold is the process holdUserns starts: it reports on stdout whether
// proc and sysfs mount, then waits for its stdin to close.
func runHold() {
	err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
	if err == nil {
		if err = unix.Mount("proc", "/proc", "proc", nsinit.NoExec, ""); err != nil {
			err = fmt.Errorf("mount proc: %w (is the host's /proc masked?)", err)
		}
	}
	if err == nil {
		if err = unix.Mount("sysfs", "/sys", "sysfs", nsinit.NoExec|unix.MS_RDONLY, ""); err != nil {
			err = fmt.Errorf("mount sysfs: %w (is the host's /sys masked?)", err)
		}
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ok")
	buf := make([]byte, 1)
	for {
		if n, err := os.Stdin.Read(buf); n == 0 || err != nil {
			return
		}
	}
}

// clone returns a detached copy of the mount at path, idmapped.
func (m *idMap) clone(path string) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("clone the mount at %s: %w", path, err)
	}
	if err := m.idmap(fd); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmap the mount at %s: %w", path, err)
	}
	return fd, nil
}

// idmap makes the detached mount fd idmapped.
func (m *idMap) idmap(fd int) error {
	return unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(m.userns)})
}

// overlay returns a detached overlay mount of the host root (or image)
// under the layer upper (with its scratch directory work) and, unless it
// is "", the stacked layer lower (over its empty base directory, see
// nsinit.StackedLower), all in the state directory dir and seen through
// the mapping.
func (m *idMap) overlay(dir, lower, empty, upper, work, image string) (int, error) {
	base := m.lower
	if image != "" {
		// An image's rootfs in place of the host root, idmapped alike:
		// its files' owners are the image's ids, which the mapping shows
		// as the same ids inside the sandbox.
		fd, err := m.clone(image)
		if err != nil {
			return -1, err
		}
		defer unix.Close(fd)
		base = fd
	}
	sfd, err := m.clone(dir)
	if err != nil {
		return -1, err
	}
	defer unix.Close(sfd)
	state := fmt.Sprintf("/proc/self/fd/%d/", sfd)
	var lowers string
	if lower == "" {
		lowers = fmt.Sprintf("/proc/self/fd/%d", base)
	} else {
		layer := state + lower
		if p := filepath.Join(dir, lower); isSymlink(p) {
			// A layer shared with other sandboxes (shared.go), outside
			// dir: mapped on its own.
			real, err := filepath.EvalSymlinks(p)
			if err != nil {
				return -1, err
			}
			lfd, err := m.clone(real)
			if err != nil {
				return -1, err
			}
			defer unix.Close(lfd)
			layer = fmt.Sprintf("/proc/self/fd/%d", lfd)
		}
		var lfd int
		lowers, lfd, err = nsinit.StackedLower(layer, state+empty, fmt.Sprintf("/proc/self/fd/%d", base), m.asSandboxRoot)
		if err != nil {
			return -1, fmt.Errorf("%w (of %s)", err, dir)
		}
		if lfd >= 0 {
			defer unix.Close(lfd)
		}
	}
	fd, err := nsinit.NewMount("overlay", [][2]string{
		{"lowerdir", lowers},
		{"upperdir", state + upper},
		{"workdir", state + work},
	}, 0, m.asSandboxRoot)
	if err != nil {
		return -1, fmt.Errorf("%w (of %s)", err, dir)
	}
	return fd, nil
}

// rights is the control message passing fds, nil for none.
func rights(fds []int) []byte {
	if len(fds) == 0 {
		return nil
	}
	return unix.UnixRights(fds...)
}

// initFDs opens (as detached mounts) what the init step of a sandbox in a user namespace
// builds on, in the order the init step takes them (nsinit): the overlay (made here, see
// overlay), the agent's directory, the agent binary and,
// unless the sandbox is a warm one, the project's mount, idmapped. The
// init step runs as the sandbox's root, which cannot reach the state
// directory by its path.
func (m *idMap) initFDs(c *nsinit.Config) (fds []int, err error) {
	defer func() {
		if err != nil {
			nsinit.CloseAll(fds)
			fds = nil
			err = fmt.Errorf("user namespace: %w", err)
		}
	}()
	dir := filepath.Dir(c.Upper)
	if filepath.Dir(c.Work) != dir {
		return nil, fmt.Errorf("upper %s and work %s are in different directories", c.Upper, c.Work)
	}
	lower, empty := "", ""
	if c.Lower != "" {
		if filepath.Dir(c.Lower) != dir || filepath.Dir(c.LowerBase) != dir {
			return nil, fmt.Errorf("upper %s and stacked layer %s (over %s) are in different directories", c.Upper, c.Lower, c.LowerBase)
		}
		lower, empty = filepath.Base(c.Lower), filepath.Base(c.LowerBase)
	}
	fd, err := m.overlay(dir, lower, empty, filepath.Base(c.Upper), filepath.Base(c.Work), c.Image)
	if err != nil {
		return nil, err
	}
	fds = append(fds, fd)
	for _, p := range []string{c.RunDir, c.Agent} {
		fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fds, fmt.Errorf("clone %s: %w", p, err)
		}
		fds = append(fds, fd)
	}
	if !c.Warm {
		fd, err := m.clone(c.ProjectSource)
		if err != nil {
			return fds, projectIdmapErr(err)
		}
		fds = append(fds, fd)
	}
	c.Userns = true
	return fds, nil
}

// projectIdmapErr explains a project mount that cannot be idmapped.
func projectIdmapErr(err error) error {
	return fmt.Errorf("the project mount cannot be seen through the sandbox's uid mapping (a cowfs mount takes idmapped mounts on Linux 6.12 and later): %w", err)
}

// asSandboxRoot runs f with this thread's file system ids set to the
// sandbox's root (host m.base) and every capability it had. overlayfs
// creates its files with its creator's ids, and through the idmapped
// upper layer only the mapped ids can own a file: the creator's must be
// the sandbox root's. The capabilities that a change of file system ids
// clears are raised again, so that a copy-up still keeps any owner and
// reads any file. The thread gets its ids and capabilities back after; it
// is not ended (which would kill the sandboxes started from it: their
// parent-death signal follows the thread), unless they cannot be put back.
func (m *idMap) asSandboxRoot(f func() error) (err error) {
	runtime.LockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var saved [2]unix.CapUserData
	if err := unix.Capget(&hdr, &saved[0]); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("capget: %w", err)
	}
	oldUID, _ := unix.SetfsuidRetUid(-1)
	oldGID, _ := unix.SetfsgidRetGid(-1)
	defer func() {
		unix.Setfsuid(oldUID)
		unix.Setfsgid(oldGID)
		c := saved
		unix.Capset(&hdr, &c[0])
		var now [2]unix.CapUserData
		u, _ := unix.SetfsuidRetUid(-1)
		g, _ := unix.SetfsgidRetGid(-1)
		if unix.Capget(&hdr, &now[0]) == nil && now == saved && u == oldUID && g == oldGID {
			runtime.UnlockOSThread()
		} else if err == nil {
			err = errors.New("could not restore this thread's file system ids")
		}
	}()
	if err := unix.Setfsgid(int(m.base)); err != nil {
		return err
	}
	if err := unix.Setfsuid(int(m.base)); err != nil {
		return err
	}
	data := saved
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return f()
}
