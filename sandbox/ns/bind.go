package ns

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// bindConfig is what a warm instance's bind step receives on fd 3, with
// the project as a detached mount (open_tree) in the same message.
type bindConfig struct {
	// Fork: a second descriptor, the sandbox's state directory, comes
	// with the project, and the root is built anew over its forkUpper
	// layer before the project is mounted (see forkRoot).
	Fork bool `json:",omitempty"`
	// Userns: the sandbox runs in a user namespace; a fork's second
	// descriptor is then its root overlay, made by the host (userns.go).
	Userns bool `json:",omitempty"`
	// API: the sandbox's api socket comes last, as a detached mount
	// (apisock.go).
	API         bool `json:",omitempty"`
	ProjectPath string
	Hide        []string
	Hostname    string
}

// startBind runs the bind step: this program again, in the sandbox's
// namespaces and root, with every capability and no seccomp filter,
// holding the control socket (fd 3) and the host root (fd 4, which it
// uses only to build a fork's root). It waits there for its one message,
// does what it says and exits; the host waits for it to be gone before
// the sandbox runs anything, so no process of the sandbox ever shares it
// with a privileged one.
func startBind(hostRoot int) error {
	// /proc/self/exe still names this program although its file system is
	// no longer reachable from the new root.
	_, err := syscall.ForkExec("/proc/self/exe", []string{"tine-sandbox-bind"}, &syscall.ProcAttr{
		Env:   []string{initEnv + "=" + modeBind},
		Files: []uintptr{0, 1, 2, 3, uintptr(hostRoot)},
	})
	if err != nil {
		return fmt.Errorf("start the bind step: %w", err)
	}
	return nil
}

// runBind is the bind step: it reports on fd 3 that it is ready, then
// reads the bind message, mounts the project, covers the hidden paths,
// sets the host name and reports "ok" or what failed.
func runBind() {
	reply := func(msg string) {
		unix.Write(3, []byte(msg))
	}
	if _, err := unix.Write(3, []byte(bindReady)); err != nil {
		return
	}
	b, fds, err := readMessage(3)
	if err != nil {
		reply("bind: read the message: " + err.Error())
		return
	}
	if err := bind(b, fds); err != nil {
		reply("bind: " + err.Error())
		return
	}
	reply("ok")
}

func bind(b []byte, fds []int) error {
	defer func() {
		for _, f := range fds {
			unix.Close(f)
		}
	}()
	var c bindConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	want := map[bool]int{false: 1, true: 2}[c.Fork]
	if c.API {
		want++
	}
	if len(fds) != want {
		return fmt.Errorf("want %d descriptors, got %d", want, len(fds))
	}
	if c.Fork && c.Userns {
		if err := forkRootUserns(fds[1]); err != nil {
			return err
		}
	} else if c.Fork {
		if err := forkRoot(fds[1]); err != nil {
			return err
		}
	}
	if !c.Userns {
		// (In a user namespace the init step passed none, and fd 4 may
		// be one of fds.)
		unix.Close(hostRootFD)
	}
	api := -1
	if c.API {
		api = fds[want-1]
	}
	return attachProject(&c, fds[0], api)
}

// attachProject mounts the project (a detached mount) at its path in the
// current root, covers the hidden paths, attaches the API socket when api
// is not -1 and sets the host name: the part of a bind that every sandbox
// needs. The bind step runs it for a fork, in the root it built; for any
// other sandbox the host runs it from a thread in the sandbox's mount and
// UTS namespaces (hostbind.go).
func attachProject(c *bindConfig, project, api int) error {
	rfd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	r := root{rfd}
	target, err := r.open(c.ProjectPath, true, false)
	if err != nil {
		return fmt.Errorf("project mount point: %w", err)
	}
	defer unix.Close(target)
	if err := unix.MoveMount(project, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount the project at %s: %w", c.ProjectPath, err)
	}
	for _, h := range c.Hide {
		if err := r.hide(strings.TrimPrefix(h, "/")); err != nil {
			return err
		}
	}
	if api >= 0 {
		if err := r.attachAPI(api); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	return nil
}

// bindReady is the bind step's first message.
const bindReady = "ready"

// hostRootFD is the bind step's descriptor of the host root.
const hostRootFD = 4

// forkRoot builds the root of a fork in place of the warm one: an overlay
// of the host root under the fork's own layer (a copy of the snapshot's,
// forkUpper in the state directory open as stateFD), with /proc, /dev and
// the rest, and pivots to it. pivot_root moves every process whose root
// was the old one, the agent among them; the old root, whose layer no one
// wrote, is detached.
func forkRoot(stateFD int) error {
	nr := "/run/.tine-fork-root" // on the warm root's /run tmpfs
	if err := unix.Mkdir(nr, 0o700); err != nil {
		return fmt.Errorf("fork root: %w", err)
	}
	state := fmt.Sprintf("/proc/self/fd/%d/", stateFD)
	return buildRoot(&initConfig{
		Warm:   true,
		Root:   nr,
		Lower:  fmt.Sprintf("/proc/self/fd/%d", hostRootFD),
		Upper:  state + forkUpper,
		Work:   state + forkWork,
		RunDir: agentDir,
		Agent:  agentBin,
	})
}

// forkRootUserns is forkRoot in a user namespace: the overlay comes made
// (see userns.go), and /proc and /sys move over from the warm root.
func forkRootUserns(overlayFD int) error {
	nr := "/run/.tine-fork-root"
	if err := unix.Mkdir(nr, 0o700); err != nil {
		return fmt.Errorf("fork root: %w", err)
	}
	mp, err := unix.Open(nr, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fork root: %w", err)
	}
	// buildRoot closes both; bind closes the descriptors it was given.
	ofd, err := unix.Dup(overlayFD)
	if err != nil {
		unix.Close(mp)
		return fmt.Errorf("fork root: %w", err)
	}
	return buildRoot(&initConfig{
		Warm:        true,
		Userns:      true,
		Root:        nr,
		overlayFD:   ofd,
		mountFD:     mp,
		runFD:       -1,
		agentFD:     -1,
		RunDir:      agentDir,
		Agent:       agentBin,
		moveProcSys: true,
	})
}
