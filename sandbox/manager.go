package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"tine/cowfs"
	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/internal/atomicfile"
	"tine/netpolicy"
)

// Options configures a Manager.
type Options struct {
	// Runtime runs the sandboxes (required): the default runtime.
	Runtime Runtime
	// Runtimes are more runtimes, each under its own Name, that a sandbox
	// may name in CreateOptions.Runtime (runtimes.go).
	Runtimes []Runtime
	// MountPool, when positive, keeps that many cowfs mounts made ahead of
	// time, so that creating or forking a sandbox does not wait for one.
	MountPool int
	// Warm, when positive and the Runtime is a Warmer, keeps that many
	// sandboxes started ahead of time (namespaces, root and agent), so that
	// creating or forking one only binds it (docs/adr/0092).
	Warm int
	// Network configures the host side of sandboxes' networks.
	Network NetworkOptions
}

// Manager owns the sandboxes under one state root: metadata in
// root/sandboxes/NAME/sandbox.json, the runtime's state beside it,
// snapshots in root/snapshots/ID. It is safe for concurrent use; one
// process at a time may manage a state root.
type Manager struct {
	root string
	fs   *cowfs.FS
	rt   Runtime
	rts  map[string]Runtime // every runtime by name, rt included (runtimes.go)
	pool *cowfs.MountPool
	warm io.Closer
	id   string // short hash of root, so cgroup names differ between roots

	ops  ops // operations Close waits for (closing.go)
	mu   sync.Mutex
	live map[string]*live
	// stopping holds the runs being stopped, so that a second stop of
	// one (a removal racing a stop, the pid-1 watcher) waits for the
	// first to end rather than going on with it half done.
	stopping map[string]*live
	// forking holds the names of the forks being made, so that two forks
	// at once name theirs apart (fork.go); under forkMu.
	forkMu  sync.Mutex
	forking map[string]bool
	ext     extra // services, logs, snapshot labels, recovery
	net     networks
	pol     policyState // audit logs, exec policy, approvals, deadlines (policy.go)
	// inside serves each sandbox's own API (inside.go).
	inside InsideAPI
	msg    messaging // inboxes (messages.go)
	git    gitBases  // GitBase of each imported directory (gitcmd.go)
}

// live is a running sandbox's host-side state.
type live struct {
	inst  Instance
	mount *cowfs.Mount
	mu    sync.Mutex
	agent *client.Client
	// idle holds agent connections that served a command that ended,
	// for the next commands (at most maxIdleConns); stopped: no more.
	idle    []*client.Client
	stopped bool
	// killed is why the manager is stopping the sandbox, set before it
	// kills its processes: what its commands' exits report (execOutcome).
	killed *killCause
	// env is the sandbox's Env, which commands giving none take (set
	// at start; it does not change while it runs).
	env []string
	// dir, uid and gid are what commands giving none take: the project
	// directory, or an image's working directory and user.
	dir      string
	uid, gid *uint32
	// apiSocket: the runtime bound the inside API's socket.
	apiSocket bool
	// stopDone is closed once a stop of this run has ended.
	stopDone chan struct{}
	// oom0 is the sandbox's OOM kill count when it started (oomCounted:
	// known), to tell an OOM kill of its pid 1 (init_watch.go); under mu.
	oom0       uint64
	oomCounted bool
}

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`) })

// Open returns a manager for the sandboxes under root, using fs for the
// projects. Sandboxes found there from an earlier run are Stopped.
func Open(ctx context.Context, root string, fs *cowfs.FS, opts Options) (*Manager, error) {
	if opts.Runtime == nil {
		return nil, errors.New("sandbox manager: no runtime given")
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"sandboxes", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			return nil, fmt.Errorf("sandbox manager: create %s: %w", d, err)
		}
	}
	sum := sha256.Sum256([]byte(root))
	m := &Manager{root: root, fs: fs, rt: opts.Runtime, id: hex.EncodeToString(sum[:4]),
		live: map[string]*live{}, stopping: map[string]*live{}, forking: map[string]bool{}}
	m.net.opts = opts.Network
	if err := m.initRuntimes(opts); err != nil {
		return nil, err
	}
	if opts.MountPool > 0 {
		p, err := fs.NewMountPool(ctx, filepath.Join(root, "mounts"), opts.MountPool, projectMountOptions())
		if err != nil {
			return nil, fmt.Errorf("sandbox manager: %w", err)
		}
		m.pool = p
	}
	if err := m.recover(ctx); err != nil {
		m.Close(ctx)
		return nil, err
	}
	// Called with no warm sandboxes too: the runtime keeps the layers
	// that sandboxes share in the same call.
	if w, ok := opts.Runtime.(Warmer); ok {
		c, err := w.Warm(ctx, WarmOptions{Dir: filepath.Join(root, "warm"), N: opts.Warm, Layers: filepath.Join(root, "layers")})
		if err != nil {
			m.Close(ctx)
			return nil, fmt.Errorf("sandbox manager: %w", err)
		}
		m.warm = c
	}
	m.startWatch()
	infos, err := m.List()
	if err != nil {
		m.Close(ctx)
		return nil, err
	}
	for _, in := range infos {
		if in.State == Running {
			in.State, in.StopReason = Stopped, "the daemon that ran it ended without stopping it (a crash, or the host restarted)"
			if err := m.save(in); err != nil {
				m.Close(ctx)
				return nil, err
			}
		}
	}
	return m, nil
}

// Close stops every running sandbox (they stay, Stopped) and the mount pool.
func (m *Manager) Close(ctx context.Context) error {
	defer m.stopWatch()
	m.ops.close()
	m.mu.Lock()
	names := make([]string, 0, len(m.live))
	for n := range m.live {
		names = append(names, n)
	}
	m.mu.Unlock()
	var errs []error
	for _, n := range names {
		errs = append(errs, m.stop(ctx, n, killCause{proto.KilledStopped, "the sandbox was stopped: the daemon shut down"}))
	}
	if m.warm != nil {
		errs = append(errs, m.warm.Close())
	}
	if m.pool != nil {
		errs = append(errs, m.pool.Close())
	}
	return errors.Join(errs...)
}

func (m *Manager) dir(name string) string      { return filepath.Join(m.root, "sandboxes", name) }
func (m *Manager) rtDir(name string) string    { return filepath.Join(m.dir(name), "runtime") }
func (m *Manager) snapDir(id string) string    { return filepath.Join(m.root, "snapshots", id) }
func (m *Manager) mountDir(name string) string { return filepath.Join(m.dir(name), "project") }

// branchName is the cowfs branch of a sandbox.
func branchName(name string) string { return "sandbox." + name }

// CreateOptions says what a new sandbox starts from.
type CreateOptions struct {
	// Name is the sandbox's name: 1-63 of [A-Za-z0-9._-].
	Name string
	// Dir is a host project directory: it is imported, and appears at the
	// same path inside the sandbox. Give Dir or Snapshot.
	Dir string
	// Snapshot is a sandbox snapshot id to start from (project and OS layer).
	Snapshot string
	// Env is the environment of commands that give none (default: PATH).
	Env    []string
	Limits Limits
	// Services are shell commands (sh -c) started now and at every later
	// start, fork and rollback.
	Services []string
	// Network is the sandbox's network policy (nil: mode none; a fork
	// takes its parent's).
	Network *netpolicy.Policy
	// Secrets binds stored secrets to destinations; the sandbox sees a
	// placeholder in its environment (a fork takes its parent's).
	Secrets []SecretBinding
	// AutoExpose forwards a host port to every new listener.
	AutoExpose bool
	// Runtime names the runtime that runs the sandbox (default: the
	// Manager's Options.Runtime; from a snapshot: the snapshot's).
	Runtime string
	// MessageTo is its message policy (ParseMessagePolicy; default: a
	// fork's parent's, else family).
	MessageTo string
	// Guest is a vm sandbox's machine size (nil: the runtime's default;
	// from a snapshot: the snapshot's). Runtimes that are not
	// GuestSizers refuse it.
	Guest *GuestSize
	// Image, when given, is the OS image the sandbox runs over in place
	// of the host's root; ImageEnv is the image's environment, which Env
	// overrides key by key. From a snapshot: the snapshot's image.
	Image    *Image
	ImageEnv []string
	// forkOf, for a fork: the snapshot Snapshot names, whose metadata
	// may still be being written; the branch was made already over it.
	forkOf *SnapshotInfo
}

// Create makes a sandbox and starts it. Its metadata is written once,
// as it starts: a crash before that leaves a directory without metadata,
// which List skips, and one during the start a Stopped sandbox.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (*Info, error) {
	done, err := m.ops.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	return m.create(ctx, o, "")
}

// create is Create, recording forkedFrom in the metadata.
func (m *Manager) create(ctx context.Context, o CreateOptions, forkedFrom string) (*Info, error) {
	if err := m.checkName(o.Name); err != nil {
		return nil, fmt.Errorf("create sandbox %q: %w", o.Name, err)
	}
	if (o.Dir == "") == (o.Snapshot == "") {
		return nil, fmt.Errorf("create sandbox %q: give exactly one of Dir and Snapshot", o.Name)
	}
	rt, err := m.pickRuntime(o)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %q: %w", o.Name, err)
	}
	if o.Guest, err = m.guestSize(rt, o); err != nil {
		return nil, fmt.Errorf("create sandbox %q: %w", o.Name, err)
	}
	if o.Image != nil && rt.Name() != "ns" {
		return nil, fmt.Errorf("create sandbox %q: the %s runtime does not take images (use the ns runtime)", o.Name, rt.Name())
	}
	if o.Image != nil && o.Snapshot != "" {
		return nil, fmt.Errorf("create sandbox %q: an image is given with a snapshot, which has its own OS layer", o.Name)
	}
	if err := os.Mkdir(m.dir(o.Name), 0o700); errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create sandbox %q: %w", o.Name, ErrExists)
	} else if err != nil {
		return nil, fmt.Errorf("create sandbox %q: %w", o.Name, err)
	}
	info := &Info{Name: o.Name, Runtime: rt.Name(), State: Stopped, Branch: branchName(o.Name),
		Created: time.Now().UTC(), Limits: o.Limits, Guest: o.Guest, Env: o.Env, Services: o.Services, ForkedFrom: forkedFrom}
	if o.Image != nil {
		img := *o.Image
		info.Image = &img
		info.Env = MergeEnv(o.ImageEnv, o.Env)
	}
	seed, err := m.prepare(ctx, info, o)
	if err == nil {
		err = m.inherit(info, o)
	}
	if err == nil {
		err = m.initMessages(info, o, forkedFrom)
	}
	if err == nil {
		m.inheritPolicy(forkedFrom, o.Name)
		err = m.initNetwork(o.Name, o.Network, forkedFrom)
	}
	if err == nil {
		err = m.initSecrets(info, o.Secrets, forkedFrom)
	}
	if err == nil && o.AutoExpose {
		err = m.setAutoFile(o.Name, true)
	}
	if err == nil {
		err = m.start(ctx, info, seed)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("create sandbox %q: %w", o.Name, err), m.Remove(ctx, o.Name))
	}
	m.audit(o.Name, "create", map[string]any{"from": info.From, "forked_from": forkedFrom, "limits": info.Limits, "services": info.Services})
	return info, nil
}

// prepare makes the sandbox's branch. It returns the runtime state the
// sandbox starts from: a snapshot's, or "" for a fresh one.
func (m *Manager) prepare(ctx context.Context, info *Info, o CreateOptions) (string, error) {
	var snap cowfs.SnapshotID
	var seed string
	if o.Dir != "" {
		dir, err := filepath.Abs(o.Dir)
		if err != nil {
			return "", err
		}
		// A directory reached through a symlink (given as one, or the
		// working directory entered through one) is the one it names: the
		// import walks without following any, and the project appears at
		// its real path, which the link reaches inside the sandbox too.
		if dir, err = filepath.EvalSymlinks(dir); err != nil {
			return "", fmt.Errorf("project directory %s: %w", o.Dir, err)
		}
		if snap, err = m.fs.Import(ctx, dir, ""); err != nil {
			return "", err
		}
		info.ProjectPath, info.From = dir, dir
	} else {
		s, err := m.createSnapshot(o)
		if err != nil {
			return "", err
		}
		if snap, err = m.fs.Resolve(ctx, s.FS); err != nil {
			return "", err
		}
		seed = filepath.Join(m.snapDir(s.ID), "runtime")
		info.ProjectPath, info.From = s.ProjectPath, s.ID
		info.Image = s.Image
		if info.Env == nil {
			info.Env = s.Env
		}
		if info.Limits.IsZero() {
			info.Limits = s.Limits
		}
	}
	info.Origin = snap.String()
	if o.forkOf == nil {
		// Durable with the sandbox's first commit; recover makes it again
		// if a crash comes first (ADR 0190).
		if err := m.fs.BranchManyDeferred(ctx, snap, []string{info.Branch}); err != nil {
			return "", err
		}
	}
	if info.Limits.ProjectBytes == 0 {
		return seed, nil // a new branch has no quota
	}
	return seed, m.fs.SetQuota(ctx, info.Branch, info.Limits.ProjectBytes)
}

// Start runs a stopped sandbox: it mounts the project and starts the
// runtime.
func (m *Manager) Start(ctx context.Context, name string) error {
	done, err := m.ops.enter()
	if err != nil {
		return err
	}
	defer done()
	info, err := m.Get(name)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(m.rollbackFile(name)); err == nil {
		return fmt.Errorf("start sandbox %q: a rollback of it did not finish: run the rollback again, or restart the daemon, which finishes it", name)
	}
	if err := m.start(ctx, info, ""); err != nil {
		return err
	}
	m.audit(name, "start", nil)
	return nil
}

// start runs the sandbox of info, its runtime state made from seed when
// given, and saves info as Running.
func (m *Manager) start(ctx context.Context, info *Info, seed string) error {
	name := info.Name
	m.mu.Lock()
	if _, ok := m.live[name]; ok {
		m.mu.Unlock()
		return nil
	}
	l := &live{env: info.Env, dir: info.ProjectPath, stopDone: make(chan struct{})}
	if info.Image != nil {
		l.uid, l.gid = info.Image.UID, info.Image.GID
		if info.Image.Workdir != "" {
			l.dir = info.Image.Workdir
		}
	}
	m.live[name] = l
	m.mu.Unlock()
	fail := func(err error) error {
		if l.inst != nil {
			err = errors.Join(err, l.inst.Stop(context.Background()))
		}
		if l.mount != nil {
			err = errors.Join(err, l.mount.Unmount())
		}
		m.mu.Lock()
		delete(m.live, name)
		m.mu.Unlock()
		return fmt.Errorf("start sandbox %q: %w", name, err)
	}
	var err error
	if m.pool != nil {
		l.mount, err = m.pool.Mount(ctx, info.Branch)
	} else {
		if err = os.MkdirAll(m.mountDir(name), 0o700); err == nil {
			l.mount, err = m.fs.Mount(ctx, info.Branch, m.mountDir(name), projectMountOptions())
		}
	}
	if err != nil {
		return fail(err)
	}
	// The first command starts in the project, whose root's attributes
	// the kernel dropped when the mount was bound: fetch them again
	// while the runtime starts, not in that command's chdir.
	go os.Lstat(l.mount.Dir())
	spec := Spec{ID: m.instanceID(name), Hostname: name, Dir: m.rtDir(name),
		ProjectPath: info.ProjectPath, ProjectSource: l.mount.Dir(),
		Hide: []string{m.root, m.fs.Root()}, Limits: info.Limits, Guest: info.Guest, Seed: seed}
	if info.Image != nil {
		if _, err := os.Stat(info.Image.Rootfs); err != nil {
			return fail(fmt.Errorf("image %s (%s) is gone from the image store (tine image pull or import it again): %w",
				info.Image.Ref, info.Image.Digest, err))
		}
		spec.Image = info.Image.Rootfs
	}
	if spec.APISocket, err = m.insideSocket(name); err != nil {
		return fail(err)
	}
	rt, err := m.runtimeOf(info)
	if err != nil {
		return fail(err)
	}
	l.apiSocket = spec.APISocket != "" && featuresOf(rt).APISocket
	// The metadata, saying Running, is written while the runtime starts:
	// the synced write waits on the disk, the start on the sandbox's
	// programs. A crash in between leaves it saying Running, which Open
	// turns into Stopped; a failed start puts the state before back.
	rec := *info
	rec.State = Running
	rec.StopReason = ""
	saved := make(chan error, 1)
	go func() { saved <- m.save(&rec) }()
	failSaved := func(err error) error {
		if <-saved == nil {
			err = errors.Join(err, m.save(info))
		}
		return fail(err)
	}
	inst, err := rt.Start(ctx, spec)
	if err != nil {
		return failSaved(err)
	}
	m.mu.Lock()
	l.inst = inst // running reads it under m.mu
	m.mu.Unlock()
	if err = m.startNetwork(ctx, name, l.inst); err != nil {
		return failSaved(err)
	}
	// The agent's shared connection (ps, ports, events: it must exist
	// before a freeze) and one for the first command are made while the
	// metadata write ends; a failure here shows at their first use.
	dialed := make(chan struct{})
	go func() {
		defer close(dialed)
		if _, err := m.Agent(ctx, name); err != nil {
			return
		}
		if c, err := dialAgent(ctx, name, l); err == nil {
			l.putConn(c)
		}
	}()
	err = <-saved
	<-dialed
	if err != nil {
		return fail(err)
	}
	info.State = Running
	info.StopReason = ""
	if oc, ok := l.inst.(OOMCounter); ok {
		n, err := oc.OOMKills()
		l.mu.Lock()
		l.oom0, l.oomCounted = n, err == nil
		l.mu.Unlock()
	}
	go m.watchInit(name, l)
	m.startServices(ctx, info, l)
	return nil
}

// Stop ends every process of the sandbox and unmounts its project; its
// files stay.
func (m *Manager) Stop(ctx context.Context, name string) error {
	return m.stop(ctx, name, causeStopped)
}

// stop is Stop; the commands running in the sandbox report cause.
func (m *Manager) stop(ctx context.Context, name string, cause killCause) error {
	return m.stopRun(ctx, name, nil, cause)
}

// stopRun is stop of the sandbox's run only (nil: whatever runs now).
// A run another call is stopping is waited for.
func (m *Manager) stopRun(ctx context.Context, name string, only *live, cause killCause) error {
	m.mu.Lock()
	l, ok := m.live[name]
	if !ok || only != nil && l != only {
		s := m.stopping[name]
		m.mu.Unlock()
		if s != nil && (only == nil || s == only) {
			<-s.stopDone
		}
		return nil
	}
	delete(m.live, name)
	m.stopping[name] = l
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.stopping, name)
		m.mu.Unlock()
		close(l.stopDone)
	}()
	defer m.audit(name, "stop", nil)
	defer m.forgetWatch(name)
	var errs []error
	m.stopExposures(name)
	m.stopNetwork(name)
	l.mu.Lock()
	if l.agent != nil {
		l.agent.Close()
	}
	for _, c := range l.idle {
		c.Close()
	}
	l.idle, l.stopped, l.killed = nil, true, &cause
	l.mu.Unlock()
	if l.inst != nil {
		errs = append(errs, l.inst.Stop(ctx))
	}
	if l.mount != nil {
		errs = append(errs, l.mount.Unmount())
	}
	if info, err := m.Get(name); err == nil {
		info.State, info.StopReason = Stopped, cause.reason
		errs = append(errs, m.save(info))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop sandbox %q: %w", name, err)
	}
	return nil
}

// Remove stops the sandbox and deletes it: its processes, cgroups,
// mounts, branch and files.
func (m *Manager) Remove(ctx context.Context, name string) error {
	return m.remove(ctx, name, causeRemoved)
}

// remove is Remove; the commands running in the sandbox report cause.
func (m *Manager) remove(ctx context.Context, name string, cause killCause) error {
	if !nameRE().MatchString(name) {
		return fmt.Errorf("remove sandbox %q: %w", name, ErrNotFound)
	}
	errs := []error{m.stop(ctx, name, cause)}
	m.forgetInside(name)
	m.forgetWatch(name) // its cached exec policy, freeze and watch state
	// Its open logs close however the removal ends (they open again
	// if used), the audit log after the removal's record.
	defer m.forgetLog(name)
	defer m.forgetAudit(name)
	// The metadata goes first, so that List does not show a sandbox whose
	// branch is being deleted (Open's recovery finishes a removal cut
	// after this).
	// Its removal is made durable before the branch goes: a sandbox.json
	// back after a crash, its branch gone, would look like a sandbox whose
	// new branch was lost, and be made again.
	if err := os.Remove(filepath.Join(m.dir(name), "sandbox.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	} else if err := atomicfile.SyncDir(m.dir(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := m.fs.DeleteBranch(ctx, branchName(name)); err != nil && !errors.Is(err, cowfs.ErrNoBranch) {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(m.dir(name)); err != nil {
		errs = append(errs, err)
	}
	m.sweep()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove sandbox %q: %w", name, err)
	}
	m.audit(name, "remove", nil)
	return nil
}

// sweep has the runtime remove what the sandboxes shared and no state
// directory refers to any more (Sweeper); what it cannot remove is left
// for the next sweep.
func (m *Manager) sweep() {
	if sw, ok := m.rt.(Sweeper); ok {
		if err := sw.Sweep(); err != nil {
			fmt.Fprintf(os.Stderr, "tine: %v\n", err)
		}
	}
}

// Get returns a sandbox's metadata.
func (m *Manager) Get(name string) (*Info, error) {
	if !nameRE().MatchString(name) {
		return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
	}
	var info Info
	if err := readJSON(filepath.Join(m.dir(name), "sandbox.json"), &info); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
		}
		return nil, fmt.Errorf("sandbox %q: %w (%v); its files are kept: tine rm %s removes it", name, ErrDamaged, err, name)
	}
	return &info, nil
}

// List returns every sandbox's metadata, sorted by name. A sandbox whose
// metadata cannot be read is listed Damaged, with its name and Problem:
// one damaged file keeps neither the others nor the daemon from working.
func (m *Manager) List() ([]*Info, error) {
	ents, err := os.ReadDir(filepath.Join(m.root, "sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var out []*Info
	for _, e := range ents {
		info, err := m.Get(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue // being created or removed
		}
		if errors.Is(err, ErrDamaged) {
			out = append(out, &Info{Name: e.Name(), State: Damaged, Problem: err.Error()})
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (m *Manager) save(info *Info) error {
	return writeJSON(filepath.Join(m.dir(info.Name), "sandbox.json"), info)
}

// running returns the live state of a running sandbox.
func (m *Manager) running(name string) (*live, error) {
	m.mu.Lock()
	l, ok := m.live[name]
	ok = ok && l.inst != nil
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotRunning)
	}
	return l, nil
}

// maxSocketPath is the longest path a Unix socket may be bound at or
// reached by (sun_path holds 108 bytes with the NUL).
const maxSocketPath = 107

// agentSocketTail is the agent's socket below a sandbox's directory (the
// ns runtime's, the longest socket path there).
const agentSocketTail = "/runtime/run/agent.sock"

// checkName checks a new sandbox's name: its form, and that the sockets
// in its directory fit the kernel's bound on socket paths under this
// state root.
func (m *Manager) checkName(name string) error {
	if !nameRE().MatchString(name) {
		return fmt.Errorf("%w %q (want 1-63 of [A-Za-z0-9._-], starting with a letter or digit)", ErrBadName, name)
	}
	if p := m.dir(name) + agentSocketTail; len(p) > maxSocketPath {
		most := maxSocketPath - len(p) + len(name)
		return fmt.Errorf("%w %q: too long for state root %s, its agent's socket %s would pass the %d bytes a socket path may have; use at most %d characters, or a shorter --root", ErrBadName, name, m.root, p, maxSocketPath, max(most, 0))
	}
	return nil
}

// Diff lists the project's changes since snapshot snap of the sandbox (its
// id or its label), or since its origin when snap is "".
func (m *Manager) Diff(ctx context.Context, name, snap string) ([]cowfs.Change, error) {
	var out []cowfs.Change
	err := m.DiffEach(ctx, name, snap, func(c cowfs.Change) error {
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DiffEach is Diff handing each change to fn as it is found, in the same
// order (cowfs.FS.DiffEach). Errors about the sandbox or the snapshot
// come before fn is first called.
func (m *Manager) DiffEach(ctx context.Context, name, snap string, fn func(cowfs.Change) error) error {
	info, err := m.Get(name)
	if err != nil {
		return err
	}
	from := info.Origin
	if snap != "" {
		s, err := m.findSnapshot(name, snap)
		if err != nil {
			return fmt.Errorf("diff sandbox %q: %w", name, err)
		}
		from = s.FS
	}
	origin, err := m.fs.Resolve(ctx, from)
	if err != nil {
		return fmt.Errorf("diff sandbox %q: %w", name, err)
	}
	head, err := m.fs.Head(ctx, info.Branch)
	if err != nil {
		return fmt.Errorf("diff sandbox %q: %w", name, err)
	}
	return m.fs.DiffEach(ctx, origin, head, cowfs.DiffOptions{GitInternals: true}, fn)
}

// writeJSON writes v to path atomically: a temporary file, fsync, rename,
// fsync of the directory.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(b, '\n'), 0o600)
}

// readJSON decodes the JSON file at path (at most 1 MiB) into v.
func readJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > 1<<20 {
		return fmt.Errorf("%s: %d bytes, more than metadata can be", path, st.Size())
	}
	if err := json.NewDecoder(f).Decode(v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}
