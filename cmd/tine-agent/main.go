// Command tine-agent is the guest agent: pid 1 of a sandbox. It listens on
// a Unix socket (or an inherited listening socket), serves the guest agent
// protocol, reaps every orphan, and on SIGTERM ends every process in the
// sandbox and exits.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"

	"tine/guestagent"
	"tine/guestagent/proto"
	"tine/internal/nsinit"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	// Started as a sandbox's init step, it builds the sandbox and
	// executes itself as the agent (package nsinit).
	nsinit.Main()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tine-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "", "Unix socket `path` to listen on (created mode 0600)")
	fd := flag.Int("fd", -1, "inherited listening socket `fd` to serve instead of --listen")
	root := flag.String("root", "/", "`directory` file transfers are confined to")
	mountProc := flag.Bool("mount-proc", false, "mount a new /proc for the agent's pid namespace (in a private mount namespace)")
	scan := flag.Duration("scan-interval", 2*time.Second, "fallback rescan period for events")
	grace := flag.Duration("grace", 5*time.Second, "how long processes get between SIGTERM and SIGKILL at shutdown")
	vsock := flag.Int("vsock", -1, "AF_VSOCK `port` to listen on instead of --listen (the vm runtime)")
	vm := flag.Bool("vm", false, "pid 1 of a VM guest: mount the kernel filesystems, load the modules under "+VMModules+", take fork-hygiene requests")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Printf("tine-agent %s (protocol %d)\n", version, proto.Version)
		return nil
	}
	given := 0
	for _, b := range []bool{*listen != "", *fd >= 0, *vsock >= 0} {
		if b {
			given++
		}
	}
	if given != 1 {
		return errors.New("give exactly one of --listen PATH, --fd N and --vsock PORT")
	}
	pid1 := os.Getpid() == 1
	if !pid1 {
		// Orphans of the processes the agent starts are reparented to it.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("become a child subreaper: %w", err)
		}
	}
	if *mountProc {
		if !pid1 {
			return errors.New("--mount-proc is for pid 1 of a new pid and mount namespace only")
		}
		if err := mountNewProc(); err != nil {
			return err
		}
	}
	if *vm {
		if !pid1 {
			return errors.New("--vm is for pid 1 of a VM guest only")
		}
		if err := vmInit(); err != nil {
			return err
		}
		vmInsideAPI()
	}
	var l net.Listener
	var err error
	if *vsock >= 0 {
		l, err = guestagent.ListenVsock(uint32(*vsock))
	} else {
		l, err = listener(*listen, *fd)
	}
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
	a, err := guestagent.New(guestagent.Config{Root: *root, ReapAll: true, ScanInterval: *scan, Hygiene: *vm})
	if err != nil {
		return err
	}
	go a.Serve(l)
	sig := <-sigs
	l.Close()
	if pid1 {
		endAll(unix.SIGTERM, *grace)
		endAll(unix.SIGKILL, *grace)
	} else {
		a.Terminate(*grace)
	}
	a.Close()
	fmt.Fprintf(os.Stderr, "tine-agent: %v: every process ended, exiting\n", sig)
	return nil
}

// endAll sends sig to every process in the pid namespace (kill(-1) from pid
// 1 spares only the agent) and waits up to grace for them to be gone; the
// reaper collects them.
func endAll(sig unix.Signal, grace time.Duration) {
	deadline := time.Now().Add(grace)
	for unix.Kill(-1, sig) == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// listener opens the Unix socket at path, or wraps the inherited fd.
func listener(path string, fd int) (net.Listener, error) {
	if fd >= 0 {
		f := os.NewFile(uintptr(fd), "inherited socket")
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("fd %d is not a listening socket: %w", fd, err)
		}
		return l, nil
	}
	if st, err := os.Lstat(path); err == nil && st.Mode().Type() == os.ModeSocket {
		os.Remove(path) // a socket left by an agent that is gone
	}
	old := unix.Umask(0o177)
	l, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}

// mountNewProc makes the mount namespace private and mounts a /proc that
// shows the agent's pid namespace.
func mountNewProc() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private before mounting /proc: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	return nil
}
