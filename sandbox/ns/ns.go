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
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"tine/sandbox"
	"tine/sandbox/internal/cgroup"
)

// Runtime starts namespace sandboxes. The zero value is not usable: use New.
type Runtime struct {
	agent string
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
	workDir  = "work"  // overlayfs's scratch directory
	rootDir  = "root"  // the overlay's mount point (in the sandbox's mount namespace only)
	runDir   = "run"   // bound at /run/tine: the agent's socket
)

// Start creates the sandbox's processes: this program re-executed as the
// init step (see Init) in new namespaces and the sandbox's cgroups, which
// builds the root and executes the agent. It returns once the agent's
// socket exists.
func (r *Runtime) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	for _, p := range []string{spec.Dir, spec.ProjectSource} {
		// overlayfs options are split at these.
		if strings.ContainsAny(p, ",:\\\n") || !filepath.IsAbs(p) {
			return nil, fmt.Errorf("start sandbox %s: path %q must be absolute and free of , : \\", spec.ID, p)
		}
	}
	for _, d := range []string{upperDir, workDir, rootDir, runDir} {
		if err := os.MkdirAll(filepath.Join(spec.Dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
		}
	}
	// The upper layer's top is the sandbox's "/": 0755 like a root
	// directory, or users other than root could not reach any file.
	if err := os.Chmod(filepath.Join(spec.Dir, upperDir), 0o755); err != nil {
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	sock := filepath.Join(spec.Dir, runDir, agentSocket)
	os.Remove(sock) // left by an earlier run
	cg, err := cgroup.New(spec.ID, spec.Limits.Pids)
	if err != nil {
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	in := &instance{id: spec.ID, sock: sock, cg: cg, done: make(chan struct{})}
	if err := in.start(r, spec); err != nil {
		cg.Remove(context.Background())
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	if err := in.waitSocket(ctx); err != nil {
		in.Stop(context.Background())
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	return in, nil
}

// start runs the init step and hands it its config once it is in the
// sandbox's cgroups.
func (in *instance) start(r *Runtime, spec sandbox.Spec) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program to run the init step: %w", err)
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	cmd := exec.Command(exe)
	cmd.Args = []string{"tine-sandbox-init"}
	cmd.Env = []string{initEnv + "=1"}
	cmd.ExtraFiles = []*os.File{cfgR}
	cmd.Stdout, cmd.Stderr = &in.log, &in.log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
			syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		// A sandbox does not outlive the process serving its project.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run the init step %s: %w", exe, err)
	}
	in.cmd = cmd
	go func() {
		cmd.Wait()
		close(in.done)
	}()
	if err := in.cg.Add(cmd.Process.Pid); err != nil {
		return errors.Join(err, in.kill())
	}
	cfg := initConfig{
		Root:          filepath.Join(spec.Dir, rootDir),
		Upper:         filepath.Join(spec.Dir, upperDir),
		Work:          filepath.Join(spec.Dir, workDir),
		ProjectPath:   spec.ProjectPath,
		ProjectSource: spec.ProjectSource,
		RunDir:        filepath.Join(spec.Dir, runDir),
		Hide:          spec.Hide,
		Hostname:      spec.Hostname,
		Agent:         r.agent,
	}
	if err := json.NewEncoder(cfgW).Encode(cfg); err != nil {
		return errors.Join(fmt.Errorf("send the init config: %w", err), in.kill())
	}
	return nil
}

// waitSocket polls for the agent's socket until it exists, the sandbox
// ends or ctx is done.
func (in *instance) waitSocket(ctx context.Context) error {
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for delay := 20 * time.Microsecond; ; delay = min(2*delay, 5*time.Millisecond) {
		if _, err := os.Stat(in.sock); err == nil {
			return nil
		}
		select {
		case <-in.done:
			return fmt.Errorf("the sandbox ended before its agent listened: %s", in.log.String())
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("no agent socket at %s after 30s: %s", in.sock, in.log.String())
		case <-time.After(delay):
		}
	}
}

// instance is a running namespace sandbox.
type instance struct {
	id   string
	sock string
	cg   *cgroup.Group
	cmd  *exec.Cmd
	done chan struct{}
	log  tail
	once sync.Once
	err  error
}

func (in *instance) AgentSocket() string              { return in.sock }
func (in *instance) Done() <-chan struct{}            { return in.done }
func (in *instance) Freeze(ctx context.Context) error { return in.cg.Freeze(ctx) }
func (in *instance) Thaw(ctx context.Context) error   { return in.cg.Thaw(ctx) }

// kill ends pid 1 of the sandbox's pid namespace, which makes the kernel
// kill every other process in it.
func (in *instance) kill() error {
	if err := in.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill sandbox %s: %w", in.id, err)
	}
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
		case <-ctx.Done():
			cerr = errors.Join(cerr, fmt.Errorf("sandbox %s: pid 1 did not end: %w", in.id, ctx.Err()))
		}
		in.err = errors.Join(kerr, cerr)
	})
	return in.err
}

// CopyState copies the sandbox's upper layer from one runtime directory to
// a new one, keeping owners, modes, xattrs (overlayfs's own among them),
// whiteouts and hard links, with reflinks where the file system has them.
func (r *Runtime) CopyState(ctx context.Context, from, to string) error {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return fmt.Errorf("copy sandbox state to %s: %w", to, err)
	}
	cmd := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", filepath.Join(from, upperDir), filepath.Join(to, upperDir))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("copy sandbox layer %s to %s: %w: %s", from, to, err, out)
	}
	return nil
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
