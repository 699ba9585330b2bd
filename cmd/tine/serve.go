package main

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"tine/api"
	"tine/cowfs"
	"tine/oci"
	"tine/sandbox"
	"tine/sandbox/ns"
	vmrt "tine/sandbox/vm"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func (a *app) serveCommand() *cobra.Command {
	var group string
	var stop, uring bool
	var warm, pool int
	var dash string
	var vs vmServe      // serve_vm.go
	var inf insideFlags // serve_inside.go
	c := &cobra.Command{
		Use:   "serve",
		Short: "run the daemon: owns the state root's store, mounts and sandboxes; answers the API on ROOT/" + api.SocketName,
		Long: "serve runs the daemon in the foreground until SIGTERM or SIGINT, which stop the\n" +
			"sandboxes (their files stay; \"tine start SB\" runs them again). Sandbox commands\n" +
			"start it on their own when it does not answer; dist/systemd/tine.service runs it\n" +
			"as a service.",
		Args: nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			if stop {
				return a.stopDaemon(c.Context())
			}
			inside, err := inf.options()
			if err != nil {
				return err
			}
			if uring && os.Geteuid() == 0 && !cowfs.URingOffered() {
				// Project mounts then answer on the CPU of their caller.
				// Before the user namespace of rootless mode, where uid 0
				// is not the host's.
				if err := cowfs.OfferURing(true); err != nil {
					fmt.Fprintf(a.stderr, "tine serve: FUSE over io_uring stays off: %v\n", err)
				}
			}
			// Not root: serve in a user namespace of its own (rootless mode).
			if err := ns.EnterRootless(); err != nil {
				return err
			}
			opts := sandbox.Options{Warm: warm, MountPool: pool, Runtimes: vs.runtimes(a.root, a.stderr)}
			return a.serve(c.Context(), group, opts, inside, dash)
		},
	}
	c.Flags().StringVar(&group, "group", "", "also let members of this group use the socket (default: root only)")
	c.Flags().BoolVar(&stop, "stop", false, "stop the daemon that serves the state root (its sandboxes stop, their files stay)")
	c.Flags().IntVar(&warm, "warm", 2, "sandboxes kept started ahead of time, so that create answers at once")
	c.Flags().IntVar(&pool, "mount-pool", 2, "project mounts kept made ahead of time")
	c.Flags().BoolVar(&uring, "fuse-uring", true, "serve project mounts over FUSE io_uring where the kernel has it (as root, turns on the fuse module's enable_uring)")
	vs.flags(c.Flags())
	c.Flags().StringVar(&inf.grant, "inside-grant", "", insideHelp[0])
	c.Flags().StringVar(&inf.max, "inside-max", "", insideHelp[1])
	c.Flags().StringVar(&dash, "dashboard", "", "also serve the web dashboard and the API on this TCP address (e.g. 127.0.0.1:8080), behind a token")
	return c
}

// serve runs the daemon until ctx ends.
func (a *app) serve(ctx context.Context, group string, opts sandbox.Options, iopts api.InsideOptions, dash string) (err error) {
	root, err := filepath.Abs(a.root)
	if err != nil {
		return err
	}
	f, err := openRoot(root)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	// A daemon killed while it reads one of its own mounts would never end
	// without the guard (docs/cowfs.md).
	if err := cowfs.StartGuard(); err != nil {
		fmt.Fprintf(a.stderr, "tine serve: %v; a kill of the daemon at the wrong moment may leave it hung\n", err)
	}
	rt, rtErr := nsRuntime()
	var runtime sandbox.Runtime = rt
	if rtErr != nil {
		fmt.Fprintf(a.stderr, "tine serve: sandboxes cannot start: %v\n", rtErr)
		runtime = unavailable{err: rtErr}
	}
	if rtErr != nil {
		opts.Warm = 0
	}
	opts.Runtime = runtime
	if opts.Network.Audit == nil {
		opts.Network.Audit = &logAuditor{w: a.stderr}
	}
	m, err := sandbox.Open(ctx, root, f, opts)
	if err != nil {
		return err
	}
	defer func() {
		// Stopping sandboxes must not be cut short by the signal that
		// ended ctx.
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = errors.Join(err, m.Close(cctx))
	}()
	fsSvc := newFSService(f)
	defer fsSvc.close()
	ln, err := api.Listen(root, group)
	if err != nil {
		return err
	}
	// Each sandbox's own API at /run/tine/api.sock (docs/api.md).
	inside := api.NewInside(m, iopts)
	m.SetInsideAPI(inside)
	defer inside.Close()
	images, err := oci.Open(filepath.Join(root, "images"), oci.Limits{})
	if err != nil {
		return err
	}
	// The host is probed once, from the start (about 80 ms of spawned
	// probes here): the client pings with GET /v1/info before every
	// command, and the runtimes this daemon serves with were chosen at
	// its start anyway.
	probed := sync.OnceValue(func() *api.Info { return hostInfo(root) })
	go probed()
	srv := api.NewServer(m, api.ServerOptions{
		Info:   func(ctx context.Context) (*api.Info, error) { return probed(), nil },
		FS:     fsSvc.run,
		Inside: inside,
		Images: images,
	})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if dash != "" {
		stopDash, err := a.serveDashboard(dash, srv)
		if err != nil {
			srv.Close()
			return err
		}
		defer stopDash()
	}
	fmt.Fprintf(a.stderr, "tine serve: %s: listening on %s (pid %d)\n", time.Now().Format(time.RFC3339), filepath.Join(root, api.SocketName), os.Getpid())
	select {
	case <-ctx.Done():
		fmt.Fprintf(a.stderr, "tine serve: %s: stopping: sandboxes stop, their files stay\n", time.Now().Format(time.RFC3339))
	case err = <-served:
		err = fmt.Errorf("serving %s: %w", filepath.Join(root, api.SocketName), err)
	}
	return errors.Join(err, srv.Close())
}

// unavailable is the runtime of a daemon that cannot start sandboxes:
// every start fails with the reason, while the rest (listing, diffs,
// snapshots of stopped sandboxes, fs commands) still works.
type unavailable struct{ err error }

func (u unavailable) Name() string { return "ns" }

func (u unavailable) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	return nil, u.err
}

func (u unavailable) CopyState(ctx context.Context, from, to string) error {
	return (&ns.Runtime{}).CopyState(ctx, from, to)
}

// nsRuntime returns the namespace runtime with the guest agent found next
// to this program or on PATH.
func nsRuntime() (*ns.Runtime, error) {
	p, err := findAgent()
	if err != nil {
		return nil, err
	}
	return ns.New(p)
}

// findAgent finds the static tine-agent binary: next to this program
// first, then on PATH.
func findAgent() (string, error) {
	var tried []string
	if exe, err := os.Executable(); err == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			p := filepath.Join(filepath.Dir(exe), "tine-agent")
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				return p, staticCheck(p)
			}
			tried = append(tried, p)
		}
	}
	if p, err := exec.LookPath("tine-agent"); err == nil {
		return p, staticCheck(p)
	}
	tried = append(tried, "tine-agent on $PATH")
	return "", fmt.Errorf("no guest agent: looked for %s; build it with CGO_ENABLED=0 go build -o DIR/tine-agent ./cmd/tine-agent next to tine",
		strings.Join(tried, ", "))
}

// staticCheck reports an agent binary that needs a dynamic loader: it runs
// as pid 1 inside sandboxes, where the host's libraries may differ.
func staticCheck(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("guest agent %s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("guest agent %s is dynamically linked; rebuild it with CGO_ENABLED=0", p)
		}
	}
	return nil
}

// fuseTransport says how new project mounts reach their server.
func fuseTransport() string {
	if cowfs.URingOffered() {
		return "io_uring"
	}
	if _, err := os.Stat("/sys/module/fuse/parameters/enable_uring"); err != nil {
		return "/dev/fuse (this kernel has no FUSE over io_uring: Linux 6.14+ with CONFIG_FUSE_IO_URING)"
	}
	return "/dev/fuse (the fuse module's enable_uring is off; tine serve turns it on as root unless --fuse-uring=false)"
}

// hostInfo says what this host can run, and why not: the runtime probe
// (ns.Probe), plus whether the guest agent the ns runtime runs is found.
func hostInfo(root string) *api.Info {
	info := &api.Info{Version: version, Root: root, FUSE: fuseTransport()}
	_, agentErr := findAgent()
	for _, r := range ns.Probe() {
		ri := api.RuntimeInfo{Name: r.Runtime, Mode: r.Mode, Available: r.OK, Reason: strings.Join(r.Why, "; ")}
		if r.OK {
			// What it runs with, where a check says more (the user namespace).
			for _, c := range r.Checks {
				switch c.Name {
				case "user namespace":
					ri.Reason = fmt.Sprintf("user namespace: %v: %s", map[bool]string{true: "yes", false: "no"}[c.OK], c.Detail)
				case "in use", "pids limit", "host files", "network":
					ri.Reason = strings.TrimPrefix(ri.Reason+"; "+c.Name+": "+c.Detail, "; ")
				}
			}
		}
		if r.Runtime == "ns" && agentErr != nil {
			ri.Available = false
			ri.Reason = strings.TrimPrefix(ri.Reason+"; "+agentErr.Error(), "; ")
		}
		if r.Runtime == "vm" { // native, nested only, or not at all
			v := vmrt.Probe()
			ri.Reason = strings.TrimPrefix(ri.Reason+"; this host: "+string(v.Support)+" ("+v.Detail+")", "; ")
		}
		info.Runtimes = append(info.Runtimes, ri)
	}
	return info
}

func (a *app) infoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "the runtimes and modes this host can run, and why not; whether a daemon answers",
		Args:  nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			root, err := filepath.Abs(a.root)
			if err != nil {
				return err
			}
			daemon := true
			info, err := a.client().Info(c.Context())
			if err != nil {
				// No daemon: say what this process can tell.
				daemon, info = false, hostInfo(root)
			}
			if a.json {
				return writeJSON(a.stdout, struct {
					*api.Info
					Daemon bool `json:"daemon"`
				}{info, daemon})
			}
			w := a.stdout
			fmt.Fprintf(w, "tine %s, state root %s\n", info.Version, info.Root)
			if daemon {
				fmt.Fprintf(w, "daemon     answering on %s\n", a.socket())
			} else {
				fmt.Fprintf(w, "daemon     not running (sandbox commands start it; or run \"tine serve\")\n")
			}
			if info.FUSE != "" {
				fmt.Fprintf(w, "%-10s %s\n", "fuse", info.FUSE)
			}
			for _, r := range info.Runtimes {
				state := "yes"
				if r.Available && r.Reason != "" {
					state = "yes (" + r.Reason + ")"
				}
				if !r.Available {
					state = "no: " + r.Reason
				}
				fmt.Fprintf(w, "%-10s %s\n", r.Name+" "+r.Mode, state)
			}
			return nil
		},
	}
}

// stopDaemon sends SIGTERM to the daemon serving the state root and waits
// until it has stopped its sandboxes and exited.
func (a *app) stopDaemon(ctx context.Context) error {
	root, err := filepath.Abs(a.root)
	if err != nil {
		return err
	}
	pid := api.DaemonPID(root)
	if pid == 0 {
		fmt.Fprintf(a.stderr, "tine serve: no daemon answers for %s\n", root)
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop the daemon (pid %d): %w", pid, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for syscall.Kill(pid, 0) == nil {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the daemon (pid %d) did not exit within two minutes; see %s", pid, filepath.Join(root, "daemon.log"))
		case <-time.After(50 * time.Millisecond):
		}
	}
	fmt.Fprintf(a.stderr, "tine serve: stopped the daemon for %s (pid %d)\n", root, pid)
	return nil
}
