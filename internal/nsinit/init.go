// Package nsinit is the init step of a namespace sandbox: the first
// process in the sandbox's new namespaces, run from the agent binary. It
// reads its Config from the host, builds the sandbox's root (an overlay
// of the host root or an image, its own /proc, /dev, /tmp and /run, the
// project, the agent's directory), brings up loopback, drops capabilities,
// loads the seccomp filter and executes the agent as pid 1. The host side
// (package sandbox/ns) also uses its Root to bind warm sandboxes.
//
// It imports no engine and nothing of the sandbox layer, so that the
// agent binary, which starts much faster than the daemon's, can carry it.
package nsinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Env in the environment marks a process started as the init step, with
// the value ModeInit; the host program uses other values for helpers of
// its own.
const Env = "TINE_SANDBOX_INIT"

// ModeInit is Env's value for the init step.
const ModeInit = "1"

// Paths inside the sandbox.
const (
	// AgentDir holds the agent's sockets.
	AgentDir = "/run/tine"
	// AgentSocket is the agent's socket's name in AgentDir.
	AgentSocket = "agent.sock"
	// APISocket is the sandbox API socket's name in AgentDir.
	APISocket = "api.sock"
	// AgentBin is where the agent binary is bound, read-only.
	AgentBin = "/run/tine-agent"
)

// MaxMessage bounds one message on the init step's control socket.
const MaxMessage = 64 << 10

// Config is what the host hands the init step over its fd 3 (one
// message on a SOCK_SEQPACKET socket); fd 4 is the agent's listening
// socket.
type Config struct {
	// Warm: the project, the hidden paths and the host name are left to
	// the host's bind (package ns: warm.go, bind.go).
	Warm bool   `json:",omitempty"`
	Root string // host path the overlay is mounted at
	// Lower, when given, is a read-only layer stacked between Upper and
	// the OS (the host root, or Image): the layer of the snapshot the
	// sandbox was made from, mounted over the empty directory LowerBase
	// (see StackedLower).
	Lower     string `json:",omitempty"`
	LowerBase string `json:",omitempty"`
	// Image is an image's unpacked root file system that is the
	// overlay's lower layer in place of the host root (see package oci).
	Image         string   `json:",omitempty"`
	Upper, Work   string   // the sandbox's overlay layer
	ProjectPath   string   // path of the project inside the sandbox
	ProjectSource string   // host directory serving it (a cowfs mount)
	RunDir        string   // host directory bound at AgentDir
	Hide          []string // host paths covered by an empty read-only tmpfs
	Hostname      string
	Agent         string // host path of the agent binary
	// TmpfsBytes bounds /tmp, /run and /dev/shm; it must be set.
	TmpfsBytes int64 `json:",omitempty"`
	// Devices are host device nodes bound at the same path; ReadOnly are
	// host files bound read-only over themselves (package ns: devices.go).
	Devices  []string `json:",omitempty"`
	ReadOnly []string `json:",omitempty"`

	// Userns: the sandbox runs in a user namespace, and the overlay, its
	// mount point, RunDir, Agent and the project come as descriptors
	// with the message (package ns: initFDs; here takeFDs).
	Userns bool `json:",omitempty"`
	// set by takeFDs
	overlayFD, mountFD, projectFD, runFD, agentFD int
	// API: the sandbox's api socket comes as a detached mount, the last
	// descriptor with the message (AttachAPI).
	API   bool `json:",omitempty"`
	apiFD int
}

// Main runs the init step when this process was started as one (Env set
// to ModeInit), and never returns then; otherwise it returns at once. The
// agent binary calls it first thing in main.
func Main() {
	if os.Getenv(Env) != ModeInit {
		return
	}
	runtime.LockOSThread() // namespaces and exec belong to this thread
	err := closeInherited()
	if err == nil {
		err = run()
	}
	fmt.Fprintf(os.Stderr, "sandbox init: %v\n", err)
	os.Exit(125)
}

// closeInherited marks every descriptor above the agent's socket (fd 4)
// close-on-exec: the host program may hold some without that flag (a
// FUSE device, pipes), and none may reach the sandbox's processes.
func closeInherited() error {
	if err := unix.CloseRange(5, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	return nil
}

// ReadMessage reads one message of at most MaxMessage bytes from the
// control socket, with the descriptors passed along it.
func ReadMessage(fd int) ([]byte, []int, error) {
	buf := make([]byte, MaxMessage)
	oob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, flags, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, err
		}
		for _, m := range msgs {
			f, err := unix.ParseUnixRights(&m)
			if err == nil {
				fds = append(fds, f...)
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		for _, f := range fds {
			unix.Close(f)
		}
		return nil, nil, errors.New("message too long")
	}
	if n == 0 {
		return nil, fds, io.EOF
	}
	return buf[:n], fds, nil
}

// run builds the sandbox's root, locks the process down and executes
// the agent. It returns only on failure.
func run() error {
	b, fds, err := ReadMessage(3)
	var c Config
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err == nil {
		fds, err = c.takeAPIFD(fds)
	}
	if err == nil && c.Userns {
		err = c.takeFDs(fds)
	} else if err == nil && len(fds) > 0 {
		CloseAll(fds)
		err = fmt.Errorf("%d descriptors with the config, want none", len(fds))
	}
	if err == nil && c.TmpfsBytes <= 0 {
		err = fmt.Errorf("tmpfs size %d, want a positive one", c.TmpfsBytes)
	}
	if err != nil {
		return fmt.Errorf("read config from fd 3: %w", err)
	}
	if err := buildRoot(&c); err != nil {
		return err
	}
	if c.Hostname != "" {
		if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	if err := LoopbackUp(); err != nil {
		return err
	}
	// The cgroup namespace starts at the sandbox's group, which the host put
	// this process in before sending the config.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("new cgroup namespace: %w", err)
	}
	unix.Close(3)
	if err := dropCapabilities(); err != nil {
		return err
	}
	if err := installFilter(); err != nil {
		return err
	}
	argv := []string{"tine-agent", "--fd", "4", "--root", "/"}
	env := []string{"PATH=" + DefaultPath}
	err = unix.Exec(AgentBin, argv, env)
	return fmt.Errorf("execute the agent: %w", err)
}

// DefaultPath is the PATH the agent runs with.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
