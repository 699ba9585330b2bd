// Package ns is the namespace runtime of package sandbox: each sandbox is
// an overlay of the host root with a private upper layer, the project
// (a cowfs mount) bound at its own path, and new mount, pid, network,
// uts, ipc and cgroup namespaces, whose pid 1 is the guest agent. Programs
// that use it call Init first thing in main.
package ns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tine/internal/atomicfile"
	"tine/internal/nsinit"
	"tine/sandbox"
	"tine/sandbox/internal/cgroup"
)

// Runtime starts namespace sandboxes. The zero value is not usable: use New.
type Runtime struct {
	agent string

	mu     sync.Mutex
	warm   *warmPool
	shared *sharedLayers // the layers forks share (shared.go), if kept

	// The last copy of each sandbox's own layer (layerindex.go).
	caps captures

	// User namespaces (userns.go).
	idOnce   sync.Once
	ids      *idMap
	idErr    error
	noUserns bool
}

// New returns a runtime whose sandboxes run the agent binary at agentPath
// (a static tine-agent) as their pid 1.
func New(agentPath string) (*Runtime, error) {
	p, err := filepath.Abs(agentPath)
	if err != nil {
		return nil, fmt.Errorf("ns runtime: agent path %s: %w", agentPath, err)
	}
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("ns runtime: agent %s is not a regular file (build cmd/tine-agent): %v", p, err)
	}
	return &Runtime{agent: p}, nil
}

// Name returns "ns".
func (r *Runtime) Name() string { return "ns" }

// The runtime's files in Spec.Dir.
const (
	upperDir = "upper" // the sandbox's writes to the host OS
	lowerDir = "lower" // a snapshot's layer it started from, stacked read-only (layerlink.go)
	emptyDir = "empty" // the stacked layer's overlay's base (nsinit.StackedLower)
	workDir  = "work"  // overlayfs's scratch directory
	rootDir  = "root"  // the overlay's mount point (in the sandbox's mount namespace only)
	runDir   = "run"   // bound at /run/tine: the agent's socket

	// A warm instance becoming a fork gets its layers here (an empty
	// one, and the snapshot's stacked) and renames them to upperDir and
	// lowerDir once its root is rebuilt.
	forkUpper = "upper.fork"
	forkLower = "lower.fork"
	forkWork  = "work.fork"
)

// makeStateDirs makes a sandbox's state directories under dir. The upper
// layer's top is the sandbox's "/": 0755 like a root directory, or users
// other than root could not reach any file.
func makeStateDirs(dir string) error {
	for _, d := range []string{upperDir, workDir, rootDir, runDir, emptyDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	return os.Chmod(filepath.Join(dir, upperDir), 0o755)
}

// Start creates the sandbox's processes. A sandbox whose Dir does not
// exist yet takes a warm instance when Warm keeps some (see warm.go);
// otherwise the agent binary runs as the init step (package nsinit) in
// new namespaces and the sandbox's cgroups, which builds the root and
// executes the agent. Either way the agent serves a listening socket the
// host made before it ran, so a connection made once Start returns is
// answered without any retry.
func (r *Runtime) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	for _, p := range []string{spec.Dir, spec.ProjectSource, spec.Image} {
		if p == "" {
			continue // no image
		}
		// overlayfs options are split at these.
		if strings.ContainsAny(p, ",:\\\n") || !filepath.IsAbs(p) {
			return nil, fmt.Errorf("start sandbox %s: path %q must be absolute and free of , : \\", spec.ID, p)
		}
	}
	if _, err := os.Lstat(spec.Dir); errors.Is(err, os.ErrNotExist) {
		// Warm sandboxes have the default tmpfs bounds and no devices.
		// and the host root: a sandbox over an image starts cold.
		if spec.Limits.TmpfsBytes == 0 && len(spec.Limits.Devices) == 0 && !spec.Limits.GPU && spec.Image == "" {
			if in, err := r.startWarm(ctx, spec); in != nil || err != nil {
				return in, err
			}
		}
		if spec.Seed != "" {
			if err := seedState(ctx, spec.Seed, spec.Image, spec.Dir, r.sharedLayers()); err != nil {
				return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
			}
		}
	} else if spec.Seed != "" {
		return nil, fmt.Errorf("start sandbox %s: state %s exists, so it cannot start from %s", spec.ID, spec.Dir, spec.Seed)
	} else if err := finishForkLayer(spec.Dir); err != nil {
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	if err := makeStateDirs(spec.Dir); err != nil {
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	cg, err := newGroup(spec.ID, spec.Limits.Pids) // group.go: cgroups, or rootless mode's
	if err != nil {
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	pt, err := devicesFor(spec.Limits)
	if err != nil {
		cg.Remove(context.Background())
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	in := &instance{id: spec.ID, dir: spec.Dir, sock: filepath.Join(spec.Dir, runDir, nsinit.AgentSocket), cg: cg, done: make(chan struct{})}
	if err := in.applyLimits(spec.Limits, spec.Dir); err != nil {
		cg.Remove(context.Background())
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	cfg := nsinit.Config{
		Root:          filepath.Join(spec.Dir, rootDir),
		Lower:         stacked(spec.Dir, lowerDir),
		LowerBase:     filepath.Join(spec.Dir, emptyDir),
		Upper:         filepath.Join(spec.Dir, upperDir),
		Work:          filepath.Join(spec.Dir, workDir),
		ProjectPath:   spec.ProjectPath,
		ProjectSource: spec.ProjectSource,
		Image:         spec.Image,
		RunDir:        filepath.Join(spec.Dir, runDir),
		Hide:          spec.Hide,
		Hostname:      spec.Hostname,
		Agent:         r.agent,
		TmpfsBytes:    spec.Limits.TmpfsBytes,
		Devices:       pt.Devices,
		ReadOnly:      pt.ReadOnly,
	}
	api := -1
	if spec.APISocket != "" {
		if api, err = openAPISocket(spec.APISocket, cfg.RunDir); err != nil {
			cg.Remove(context.Background())
			return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
		}
		defer unix.Close(api)
		cfg.API = true
	}
	if err := in.start(r, cfg, api); err != nil {
		cg.Remove(context.Background())
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	return in, nil
}

// start makes the agent's listening socket, runs the init step (the
// agent binary, in its nsinit mode) with it and a control socket, puts
// it in the sandbox's cgroups and then sends it cfg, with the api
// socket's mount api unless it is -1.
func (in *instance) start(r *Runtime, cfg nsinit.Config, api int) error {
	if cfg.TmpfsBytes <= 0 {
		cfg.TmpfsBytes = sandbox.DefaultTmpfsBytes
	}
	os.Remove(in.sock) // left by an earlier run
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: in.sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("agent socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	lf, err := l.File()
	l.Close()
	if err != nil {
		return fmt.Errorf("agent socket: %w", err)
	}
	defer lf.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("init control socket: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "init control")
	defer child.Close()
	unix.SetNonblock(fds[0], true)
	cf := os.NewFile(uintptr(fds[0]), "init control")
	c, err := net.FileConn(cf)
	cf.Close()
	if err != nil {
		return fmt.Errorf("init control socket: %w", err)
	}
	ctl := c.(*net.UnixConn)
	defer ctl.Close()
	// User namespace (userns.go): the descriptors the init step builds on.
	ids, _ := r.usernsSetup()
	if len(cfg.Devices) > 0 || len(cfg.ReadOnly) > 0 {
		// Host device nodes belong to host users the namespace does not
		// map: a sandbox given devices runs without one (docs/policy.md).
		ids = nil
	}
	var passed []int
	if ids != nil {
		if passed, err = ids.initFDs(&cfg); err != nil {
			return err
		}
		defer nsinit.CloseAll(passed)
	}
	if api >= 0 {
		passed = append(passed, api) // closed by Start
	}
	args := []string{"tine-sandbox-init"}
	env := []string{initEnv + "=" + nsinit.ModeInit}
	flags := uintptr(syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
		syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC)
	if ids != nil {
		// A new user namespace: through the spawner, whose fork is
		// cheap (spawn.go).
		in.ids = ids
		if err := in.spawn(spawnRequest{Path: r.agent, Args: args, Env: env, Cloneflags: flags | syscall.CLONE_NEWUSER,
			Base: ids.base, Size: ids.size}, child, lf); err != nil {
			return fmt.Errorf("run the init step %s: %w", r.agent, err)
		}
	} else {
		cmd := &exec.Cmd{Path: r.agent, Args: args, Env: env, ExtraFiles: []*os.File{child, lf}, // fd 3, fd 4
			Stdout: &in.log, Stderr: &in.log,
			// A sandbox does not outlive the process serving its project.
			SysProcAttr: &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("run the init step %s: %w", r.agent, err)
		}
		// Not reaped before Wait: the pid names the child until then.
		pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		go func() {
			cmd.Wait()
			close(in.done)
		}()
		if err != nil {
			cmd.Process.Kill()
			return fmt.Errorf("pidfd of the init step: %w", err)
		}
		in.pid, in.pidfd = cmd.Process.Pid, os.NewFile(uintptr(pidfd), "pidfd")
	}
	fail := func(err error) error {
		return errors.Join(err, in.kill())
	}
	if err := in.cg.Add(in.pid); err != nil {
		return fail(err)
	}
	b, err := json.Marshal(cfg)
	if err == nil && len(b) > nsinit.MaxMessage {
		err = fmt.Errorf("%d bytes, more than %d", len(b), nsinit.MaxMessage)
	}
	if err == nil {
		_, _, err = ctl.WriteMsgUnix(b, rights(passed), nil)
	}
	if err != nil {
		return fail(fmt.Errorf("send the init config: %w", err))
	}
	return nil
}

// instance is a running namespace sandbox.
type instance struct {
	id   string
	dir  string // the runtime directory (warm instances: until bound)
	sock string
	cg   group
	ids  *idMap // its user namespace's mapping; nil without one
	// pid and pidfd are the init step's, which becomes the agent: pid 1
	// of the sandbox's pid namespace. done closes when it has ended.
	pid   int
	pidfd *os.File
	done  chan struct{}
	// limits are the cgroup limits applyLimits set last, if it did.
	limits *cgroup.Limits
	// pid1 is a pidfd of a warm instance's pid 1, until it is bound
	// (see warm.go).
	pid1 *os.File
	log  tail
	once sync.Once
	err  error
}

// AgentSocket returns the agent's socket path.
func (in *instance) AgentSocket() string { return in.sock }

func (in *instance) Done() <-chan struct{}            { return in.done }
func (in *instance) Freeze(ctx context.Context) error { return in.cg.Freeze(ctx) }
func (in *instance) Thaw(ctx context.Context) error   { return in.cg.Thaw(ctx) }

// kill ends pid 1 of the sandbox's pid namespace, which makes the kernel
// kill every other process in it.
func (in *instance) kill() error {
	if in.pidfd == nil {
		return nil
	}
	if err := unix.PidfdSendSignal(int(in.pidfd.Fd()), unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
		return fmt.Errorf("kill sandbox %s: %w", in.id, err)
	}
	return nil
}

// spawn starts the init step through the spawner; its output goes to
// the instance's log.
func (in *instance) spawn(req spawnRequest, ctl, lis *os.File) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	pid, pidfd, err := theSpawner.spawn(req, w, ctl, lis)
	w.Close()
	if err != nil {
		r.Close()
		return err
	}
	go func() {
		io.Copy(&in.log, r)
		r.Close()
	}()
	in.pid, in.pidfd = pid, pidfd
	go func() {
		waitPidfd(pidfd)
		close(in.done)
	}()
	return nil
}

// Stop kills pid 1, then anything left in the cgroups, and removes them.
// The sandbox's mounts live in its own mount namespace and go with it.
func (in *instance) Stop(ctx context.Context) error {
	in.once.Do(func() {
		kerr := in.kill()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		cerr := in.cg.Remove(ctx)
		select {
		case <-in.done:
			if in.pidfd != nil {
				in.pidfd.Close() // its waiter is done with it
			}
		case <-ctx.Done():
			cerr = errors.Join(cerr, fmt.Errorf("sandbox %s: pid 1 did not end: %w", in.id, ctx.Err()))
		}
		in.err = errors.Join(kerr, cerr)
	})
	return in.err
}

// CopyState copies the sandbox's layers from one runtime directory to a
// new one: its own layer by value, keeping owners, modes, xattrs
// (overlayfs's own among them), whiteouts and hard links, with reflinks
// where the file system has them, and the layer it stacks (never
// written) by hard links. The copy is atomic and durable: it is made in a
// temporary directory beside to, written out with syncfs and renamed
// into place, so that after a crash to is either missing or whole (and a
// directory named ".tmp-" and to's name may be left beside it).
func (r *Runtime) CopyState(ctx context.Context, from, to string) error {
	finish, err := r.CaptureState(ctx, from, to)
	if err != nil {
		return err
	}
	return finish()
}

// CaptureState implements sandbox.StateCapturer: the copy of CopyState's
// own layer, in its temporary directory, linking the files that the
// sandbox's last copy or PrepareState's holds unchanged; finish links
// the stacked layer, which no one writes, so it is not read frozen (it
// is held open, so that it is the same one however from is renamed
// meanwhile), writes it all out (syncfs, which waits for every dirty
// page of the file system, however long) and renames it.
func (r *Runtime) CaptureState(ctx context.Context, from, to string) (func() error, error) {
	lower := -1
	if p := stacked(from, lowerDir); p != "" {
		// Followed: a shared layer is a symlink (shared.go).
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("copy sandbox state to %s: %w", to, err)
		}
		lower = fd
	}
	var index *layerIndex
	finish, err := makeState(to, func(tmp string) error {
		var err error
		index, err = copyLayerIndexed(ctx, filepath.Join(from, upperDir), filepath.Join(tmp, upperDir), r.caps.get(from), r.caps.takePre(to))
		return err
	})
	if err != nil {
		os.RemoveAll(preDir(to))
		if lower >= 0 {
			unix.Close(lower)
		}
		return nil, err
	}
	return func() error {
		// The pre-copy's files that the copy took are linked there.
		os.RemoveAll(preDir(to))
		if lower >= 0 {
			defer unix.Close(lower)
			// The descriptor's directory, not its link: the path ends in "/".
			src := fmt.Sprintf("/proc/self/fd/%d/", lower)
			if err := linkLayers(ctx, []string{src}, "", filepath.Join(stateTmp(to), lowerDir)); err != nil {
				os.RemoveAll(stateTmp(to))
				return fmt.Errorf("copy sandbox state to %s: %w", to, err)
			}
		}
		if err := finish(); err != nil {
			return err
		}
		if index != nil {
			index.root = filepath.Join(to, upperDir)
			r.caps.put(from, index)
		}
		return nil
	}, nil
}

// PrepareState implements sandbox.StateCapturer: it copies the files of
// the sandbox's own layer that its last snapshot does not hold
// unchanged, with the sandbox running, so that CaptureState, frozen,
// links them (ADR 0207). Nothing is copied when they are few.
func (r *Runtime) PrepareState(ctx context.Context, from, to string) error {
	pre := preDir(to)
	if err := os.RemoveAll(pre); err != nil {
		return fmt.Errorf("copy sandbox state to %s: %w", to, err)
	}
	x, err := precopy(ctx, filepath.Join(from, upperDir), pre, r.caps.get(from))
	if err != nil {
		os.RemoveAll(pre)
		return fmt.Errorf("copy sandbox state to %s ahead of the freeze: %w", to, err)
	}
	if x != nil {
		r.caps.setPre(to, x)
	}
	return nil
}

// preDir is where PrepareState copies for a capture into to.
func preDir(to string) string {
	return filepath.Join(filepath.Dir(to), ".tmp-pre-"+filepath.Base(to))
}

// seedState makes the state directory to of a sandbox over the OS tree
// image ("": the host's) that starts from the state seed of a snapshot:
// seed's layers, which no one writes, stacked as its lower layer and an
// empty layer of its own (or, in rootless mode, whose overlays take no
// stacked layer, a copy). Over the host's OS tree, the stacked layer is
// the one the sandboxes made from seed share, where shared is not nil
// (ADR 0215).
func seedState(ctx context.Context, seed, image, to string, shared *sharedLayers) error {
	if Rootless() {
		return (&Runtime{}).CopyState(ctx, seed, to)
	}
	if shared != nil && image == "" && stackable() {
		// The layer is durable before it is named; a directory of two
		// names is made durable with fsyncs, not a syncfs.
		tmp := stateTmp(to)
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return err
		}
		ok, err := shared.use(ctx, seed, tmp, lowerDir)
		if ok {
			if err = atomicfile.SyncDir(tmp); err == nil {
				err = os.Rename(tmp, to)
			}
			if err == nil {
				return atomicfile.SyncDir(filepath.Dir(to))
			}
		}
		os.RemoveAll(tmp)
		if err != nil {
			return fmt.Errorf("copy sandbox state to %s: %w", to, err)
		}
	}
	finish, err := makeState(to, func(tmp string) error {
		return osBase(image, func(base string) error {
			return stackSeed(ctx, seed, base, filepath.Join(tmp, lowerDir), filepath.Join(tmp, upperDir))
		})
	})
	if err != nil {
		return err
	}
	return finish()
}

// makeState runs fill on a new temporary directory beside to and returns
// finish, which writes it out (syncfs) and renames it to to; either
// removes it if it fails.
func makeState(to string, fill func(tmp string) error) (func() error, error) {
	tmp := stateTmp(to)
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("copy sandbox state to %s: %w", to, err)
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("copy sandbox state to %s: %w", to, err)
	}
	if err := fill(tmp); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("copy sandbox state to %s: %w", to, err)
	}
	return func() error {
		err := syncTree(context.Background(), tmp)
		if err == nil {
			err = os.Rename(tmp, to)
		}
		if err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("copy sandbox state to %s: %w", to, err)
		}
		if err := atomicfile.SyncDir(filepath.Dir(to)); err != nil {
			return fmt.Errorf("copy sandbox state to %s: %w", to, err)
		}
		return nil
	}, nil
}

// stateTmp is the temporary directory a state directory to is made in.
func stateTmp(to string) string {
	return filepath.Join(filepath.Dir(to), ".tmp-"+filepath.Base(to))
}

// stacked returns the path of the layer name in the state directory dir,
// or "" when dir has none.
func stacked(dir, name string) string {
	p := filepath.Join(dir, name)
	if _, err := os.Lstat(p); err != nil {
		return ""
	}
	return p
}

// tail keeps the last 4 KiB written to it: the init step's and the
// agent's messages, for errors.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 4 << 10

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(b)
	if len(b) > tailMax {
		b = b[len(b)-tailMax:]
	}
	t.buf = append(t.buf, b...)
	if len(t.buf) > tailMax {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailMax:]...)
	}
	return n, nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}
