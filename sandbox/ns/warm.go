package ns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"tine/internal/atomicfile"
	"tine/internal/nsinit"

	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/internal/quiet"
	"tine/sandbox"
	"tine/sandbox/internal/cgroup"
)

// A warm instance is a sandbox started ahead of time for no one: its
// namespaces, an overlay root with an empty upper layer, /proc, /dev and
// the rest are built, its cgroups have the default limits, and its agent
// runs and has answered a handshake. Start binds one to a sandbox whose
// state directory does not exist yet: the state directory with its empty
// upper layer (renamed into place), the cgroups (renamed to Spec.ID), and,
// from the host's binding thread in the sandbox's mount and UTS
// namespaces (binder.go, bind.go), the project (a detached clone of
// ProjectSource), the hidden paths and the host name. With a Seed (a
// fork) that thread first builds a new root over a copy of the seed's
// layer and pivots to it. An instance is bound once and never returns to
// the pool: no state passes from one sandbox to another. See
// docs/adr/0092, 0093 and 0185.

// warmPool keeps warm instances under one directory.
type warmPool struct {
	r      *Runtime
	dir    string
	shared *sharedLayers // the layers its forks share, if kept
	n      int
	ready  chan *instance
	wake   chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	lastErr error
	bound   int
}

// refillDelay is how long the pool waits after the last take before it
// starts a replacement: a fork into many takes several at once.
const refillDelay = 50 * time.Millisecond

// refillMax bounds the wait for a quiet host before each replacement:
// starting one costs three program starts, which would compete with the
// sandboxes just bound, and their first commands, for a small host's
// CPUs (docs/adr/0194).
const refillMax = 250 * time.Millisecond

// Warm keeps o.N sandboxes started ahead of time in directories under
// o.Dir, which must be on the same file system as the state directories
// of the sandboxes they become. Closing the result ends those not taken.
// On a host with cgroup v2 (whose groups cannot be renamed) and in rootless
// mode it keeps none
// and every Start is a cold one. The shared layers in o.Layers are kept
// whatever o.N, but in rootless mode, whose sandboxes copy their layers.
func (r *Runtime) Warm(ctx context.Context, o sandbox.WarmOptions) (io.Closer, error) {
	for _, d := range []string{o.Dir, o.Layers} {
		if d != "" && (strings.ContainsAny(d, ",:\\\n") || !filepath.IsAbs(d)) {
			return nil, fmt.Errorf("warm sandboxes: directory %q must be absolute and free of , : \\", d)
		}
	}
	if o.Layers != "" && !Rootless() {
		if err := r.keepLayers(o.Layers); err != nil {
			return nil, fmt.Errorf("warm sandboxes: %w", err)
		}
	}
	if o.N <= 0 || !cgroup.CanRename() || Rootless() {
		return io.NopCloser(nil), nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.warm != nil {
		return nil, errors.New("warm sandboxes: this runtime already keeps some; close them first")
	}
	// Instances left by an earlier process died with it (Pdeathsig);
	// their state and their cgroups, of any earlier process, go now.
	if err := os.RemoveAll(o.Dir); err != nil {
		return nil, fmt.Errorf("warm sandboxes: clear %s: %w", o.Dir, err)
	}
	cgroup.RemoveLeftovers(ctx, warmPrefix, leftoverAge)
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("warm sandboxes: %w", err)
	}
	p := &warmPool{r: r, dir: o.Dir, shared: r.shared, n: o.N, ready: make(chan *instance, o.N),
		wake: make(chan struct{}, 1), stop: make(chan struct{})}
	r.warm = p
	p.wg.Add(1)
	go p.fill()
	return p, nil
}

// pool returns the runtime's warm pool, if any.
func (r *Runtime) pool() *warmPool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.warm
}

// Close ends the instances not taken and removes their directories.
func (p *warmPool) Close() error {
	p.r.mu.Lock()
	if p.r.warm == p {
		p.r.warm = nil
	}
	p.r.mu.Unlock()
	select {
	case <-p.stop:
		return nil
	default:
	}
	close(p.stop)
	p.wg.Wait()
	var errs []error
	for {
		select {
		case in := <-p.ready:
			errs = append(errs, in.discard())
		default:
			return errors.Join(append(errs, os.RemoveAll(p.dir))...)
		}
	}
}

// fill keeps the pool full, one instance at a time.
func (p *warmPool) fill() {
	defer p.wg.Done()
	backoff := 100 * time.Millisecond
	for refill := false; ; refill = true {
		for len(p.ready) < p.n {
			// The first fill is made at once; later ones yield to the
			// sandboxes taken.
			if refill && !quiet.Wait(p.stop, refillMax) {
				return
			}
			in, err := p.make()
			if err != nil {
				p.mu.Lock()
				p.lastErr = err
				p.mu.Unlock()
				select {
				case <-p.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 10*time.Second)
				continue
			}
			backoff = 100 * time.Millisecond
			select {
			case <-p.stop:
				in.discard()
				return
			case p.ready <- in:
			}
		}
		select {
		case <-p.stop:
			return
		case <-p.wake:
		}
		// Wait until no sandbox was taken for refillDelay; under a
		// steady stream of takes, start after refillMax anyway.
		limit := time.After(refillMax)
		for still := false; !still; {
			select {
			case <-p.stop:
				return
			case <-p.wake:
			case <-time.After(refillDelay):
				still = true
			case <-limit:
				still = true
			}
		}
	}
}

// take returns a warm instance, or nil when none is ready.
func (p *warmPool) take() *instance {
	select {
	case in := <-p.ready:
		select {
		case p.wake <- struct{}{}:
		default:
		}
		return in
	default:
		select {
		case p.wake <- struct{}{}:
		default:
		}
		return nil
	}
}

// warmPrefix begins the cgroup name of every warm instance.
const warmPrefix = "warm-"

// leftoverAge is how old a warm instance's cgroup with no task must be
// for Warm to take it for the leftover of a process that died: a live
// pool puts an instance's first task in within milliseconds.
const leftoverAge = time.Minute

// warmTimeout bounds the start of one warm instance.
const warmTimeout = 30 * time.Second

// make starts one warm instance and returns it once its agent has
// answered.
func (p *warmPool) make() (*instance, error) {
	var rnd [6]byte
	rand.Read(rnd[:])
	id := warmPrefix + hex.EncodeToString(rnd[:])
	dir := filepath.Join(p.dir, id)
	if err := makeStateDirs(dir); err != nil {
		return nil, fmt.Errorf("warm sandbox: %w", err)
	}
	cg, err := cgroup.New(id, 0)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("warm sandbox: %w", err)
	}
	in := &instance{id: id, dir: dir, sock: filepath.Join(dir, runDir, nsinit.AgentSocket), cg: cg, done: make(chan struct{})}
	// The default limits, which most sandboxes keep: bind then has
	// nothing to write.
	if err := in.applyLimits(sandbox.Limits{}, dir); err != nil {
		cg.Remove(context.Background())
		os.RemoveAll(dir)
		return nil, fmt.Errorf("warm sandbox: %w", err)
	}
	err = in.start(p.r, nsinit.Config{
		Warm:     true,
		Root:     filepath.Join(dir, rootDir),
		Upper:    filepath.Join(dir, upperDir),
		Work:     filepath.Join(dir, workDir),
		RunDir:   filepath.Join(dir, runDir),
		Hostname: "tine",
		Agent:    p.r.agent,
	}, -1)
	if err != nil {
		cg.Remove(context.Background())
		os.RemoveAll(dir)
		return nil, fmt.Errorf("warm sandbox: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
	var c *client.Client
	if c, err = client.Dial(ctx, in.sock); err == nil {
		warmUp(ctx, c)
		c.Close()
	}
	cancel()
	if err == nil {
		in.pid1, err = openPidfd(in.pid, "pid 1")
	}
	if err == nil {
		// pid 1 is this program's child: until done, it is not reaped, so
		// its pid named it when the pidfd was opened.
		select {
		case <-in.done:
			err = errors.New("pid 1 ended")
		default:
		}
	}
	if err != nil {
		err = fmt.Errorf("warm sandbox: %w: %s", err, in.log.String())
		return nil, errors.Join(err, in.discard())
	}
	return in, nil
}

// warmUp runs `true` in a warm instance before it waits in the pool, so
// that the first command of the sandbox it becomes does not pay for the
// agent's first fork and the new root's first look-ups (the dynamic
// loader, the C library, the PATH directories). It writes nothing; a
// failure only leaves the instance cold.
func warmUp(ctx context.Context, c *client.Client) {
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"true"}, Dir: "/"})
	if err == nil {
		p.Wait(ctx)
	}
}

// openPidfd returns a pidfd of pid.
func openPidfd(pid int, what string) (*os.File, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd of the %s (pid %d): %w", what, pid, err)
	}
	return os.NewFile(uintptr(fd), what), nil
}

// unwarm closes the pidfd a warm instance holds until it is bound.
func (in *instance) unwarm() {
	if in.pid1 != nil {
		in.pid1.Close()
		in.pid1 = nil
	}
}

// discard ends a warm instance that was not bound.
func (in *instance) discard() error {
	in.unwarm()
	err := in.Stop(context.Background())
	return errors.Join(err, os.RemoveAll(in.dir))
}

// startWarm binds a warm instance to spec, or returns nil, nil when none
// is ready.
func (r *Runtime) startWarm(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	p := r.pool()
	if p == nil {
		return nil, nil
	}
	in := p.take()
	if in == nil {
		return nil, nil
	}
	if err := in.bind(ctx, spec, p.shared); err != nil {
		in.unwarm()
		in.Stop(context.Background())
		os.RemoveAll(in.dir)
		return nil, fmt.Errorf("start sandbox %s: %w: %s", spec.ID, err, in.log.String())
	}
	p.mu.Lock()
	p.bound++
	p.mu.Unlock()
	return in, nil
}

// bind makes the warm instance sandbox spec (see warmPool).
func (in *instance) bind(ctx context.Context, spec sandbox.Spec, shared *sharedLayers) error {
	if err := os.Rename(in.dir, spec.Dir); err != nil {
		return fmt.Errorf("move the warm sandbox's state: %w", err)
	}
	in.dir, in.sock = spec.Dir, filepath.Join(spec.Dir, runDir, nsinit.AgentSocket)
	fork := spec.Seed != ""
	if err := in.cg.(*cgroup.Group).Rename(spec.ID); err != nil {
		return err
	}
	in.id = spec.ID
	if err := in.applyLimits(spec.Limits, spec.Dir); err != nil {
		return err
	}
	var fds []int
	defer func() {
		for _, f := range fds {
			unix.Close(f)
		}
	}()
	var project int
	var err error
	if in.ids != nil {
		if project, err = in.ids.clone(spec.ProjectSource); err != nil {
			return projectIdmapErr(err)
		}
	} else if project, err = unix.OpenTree(unix.AT_FDCWD, spec.ProjectSource, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC); err != nil {
		return fmt.Errorf("clone the project mount %s: %w", spec.ProjectSource, err)
	}
	fds = append(fds, project)
	// The fork's layers last: a shared one may be being made by another
	// fork meanwhile.
	if fork {
		if err := stackFork(ctx, spec, shared); err != nil {
			return err
		}
	}
	overlay, api := -1, -1
	if fork && in.ids != nil {
		if overlay, err = in.ids.overlay(spec.Dir, forkLower, emptyDir, forkUpper, forkWork, ""); err != nil {
			return fmt.Errorf("fork root: %w", err)
		}
		fds = append(fds, overlay)
	} else if fork {
		if overlay, err = hostOverlay(filepath.Join(spec.Dir, forkLower), filepath.Join(spec.Dir, emptyDir), filepath.Join(spec.Dir, forkUpper), filepath.Join(spec.Dir, forkWork)); err != nil {
			return fmt.Errorf("fork root: %w", err)
		}
		fds = append(fds, overlay)
	}
	if spec.APISocket != "" {
		if api, err = openAPISocket(spec.APISocket, filepath.Join(spec.Dir, runDir)); err != nil {
			return err
		}
		fds = append(fds, api)
	}
	c := bindConfig{ProjectPath: spec.ProjectPath, Hide: spec.Hide, Hostname: spec.Hostname}
	pid1 := in.pid1
	in.pid1 = nil
	defer pid1.Close()
	err = inNamespaces(int(pid1.Fd()), in.ids, func() error {
		if fork {
			if err := forkRoot(overlay); err != nil {
				return err
			}
		}
		return attachProject(&c, project, api)
	})
	if err != nil {
		return err
	}
	if fork {
		return swapForkLayer(spec.Dir)
	}
	return nil
}

// stackFork makes the layers of a fork's new root in its state directory
// (forkUpper, forkWork, forkLower) from its seed. A seed cannot go into
// the layer already mounted (overlayfs caches what it looked up): the
// bind builds a new root over an empty layer with the seed's stacked
// below it (docs/adr/0093, 0206): the layer shared by the forks of the
// seed where there is one (0215), a layer of its own otherwise. The
// stacked layer is whole and durable before it takes its name, as
// seedState's, so that a fork's OS layer survives a crash once the fork
// is made; the empty layer is made first, so that a stacked layer with
// its name has it beside it (finishForkLayer).
func stackFork(ctx context.Context, spec sandbox.Spec, shared *sharedLayers) error {
	if err := os.Mkdir(filepath.Join(spec.Dir, forkUpper), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(spec.Dir, forkWork), 0o700); err != nil {
		return err
	}
	if shared != nil && stackable() {
		if ok, err := shared.use(ctx, spec.Seed, spec.Dir, forkLower); ok || err != nil {
			return err
		}
	}
	tmp := filepath.Join(spec.Dir, ".tmp-"+forkLower)
	if err := osBase("", func(base string) error {
		return stackSeed(ctx, spec.Seed, base, tmp, filepath.Join(spec.Dir, forkUpper))
	}); err != nil {
		return err
	}
	if err := syncTree(ctx, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(spec.Dir, forkLower))
}

// swapForkLayer gives a bound fork's layers the usual names (the overlay
// holds its layers by dentry, so renames do not disturb it) and removes
// the warm root's layer, detached and never written by the sandbox.
func swapForkLayer(dir string) error {
	for _, n := range [][2]string{{upperDir, forkUpper}, {workDir, forkWork}} {
		old := filepath.Join(dir, n[0]+".warm")
		if err := os.Rename(filepath.Join(dir, n[0]), old); err != nil {
			return fmt.Errorf("fork layer: %w", err)
		}
		if err := os.Rename(filepath.Join(dir, n[1]), filepath.Join(dir, n[0])); err != nil {
			return fmt.Errorf("fork layer: %w", err)
		}
		os.RemoveAll(old)
	}
	if err := os.Rename(filepath.Join(dir, forkLower), filepath.Join(dir, lowerDir)); err != nil {
		return fmt.Errorf("fork layer: %w", err)
	}
	return atomicfile.SyncDir(dir)
}

// finishForkLayer completes, in a stopped sandbox's state directory dir,
// a swapForkLayer that a crash cut short: a fork's layers, whole once
// the stacked one has its name, replace the warm root's, and what the
// swap would have removed goes. A bind cut short before that leaves the
// warm root's layer, with nothing stacked.
func finishForkLayer(dir string) error {
	if _, err := os.Lstat(filepath.Join(dir, forkLower)); err == nil {
		if _, err := os.Lstat(filepath.Join(dir, forkUpper)); err == nil {
			if err := os.RemoveAll(filepath.Join(dir, upperDir)); err != nil {
				return fmt.Errorf("fork layer: %w", err)
			}
			if err := os.Rename(filepath.Join(dir, forkUpper), filepath.Join(dir, upperDir)); err != nil {
				return fmt.Errorf("fork layer: %w", err)
			}
		}
		if err := os.Rename(filepath.Join(dir, forkLower), filepath.Join(dir, lowerDir)); err != nil {
			return fmt.Errorf("fork layer: %w", err)
		}
	}
	leftover := []string{forkUpper, forkWork, upperDir + ".warm", workDir + ".warm", ".tmp-" + forkLower, ".tmp-" + forkUpper}
	if _, err := os.Lstat(filepath.Join(dir, lowerDir)); errors.Is(err, os.ErrNotExist) {
		leftover = append(leftover, forkRef) // a shared layer's, linked before the bind was cut short
	}
	for _, n := range leftover {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return fmt.Errorf("fork layer: %w", err)
		}
	}
	return nil
}

// WarmReady returns how many warm instances are started and waiting.
func (r *Runtime) WarmReady() int {
	if p := r.pool(); p != nil {
		return len(p.ready)
	}
	return 0
}

// WarmBound returns how many sandboxes were started by binding a warm
// instance since Warm.
func (r *Runtime) WarmBound() int {
	p := r.pool()
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bound
}

// WaitWarm waits until n warm instances are waiting or ctx ends; it
// returns the last error of starting one, if ctx ended.
func (r *Runtime) WaitWarm(ctx context.Context, n int) error {
	for r.WarmReady() < n {
		select {
		case <-ctx.Done():
			var last error
			if p := r.pool(); p != nil {
				p.mu.Lock()
				last = p.lastErr
				p.mu.Unlock()
			}
			return errors.Join(fmt.Errorf("%d warm sandboxes of %d ready: %w", r.WarmReady(), n, ctx.Err()), last)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}
