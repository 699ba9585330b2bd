package vm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tine/chunkstore"
	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/sandbox"
	"tine/vmm/disk"
	"tine/vmm/linux"
	"tine/vmm/virtio"
)

// AgentPort is the vsock port the guest agent listens on.
const AgentPort = 1024

// VirtioModules are the kernel modules the guest loads at boot, in
// dependency order (Debian's cloud kernel builds them as modules).
var VirtioModules = []string{"virtio_ring", "virtio", "virtio_mmio", "virtio-rng", "virtio_console", "virtio_blk",
	"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport",
	"failover", "net_failover", "virtio_net", "fuse", "virtiofs"}

// Config is what the vm runtime boots.
type Config struct {
	// Kernel is a Linux kernel: an uncompressed vmlinux with a PVH note,
	// or a bzImage.
	Kernel string
	// Modules is the directory holding VirtioModules as NAME.ko
	// (default: the kernel's directory).
	Modules string
	// Agent is a static tine-agent; it is the guest's pid 1.
	Agent string
	// Busybox, when given, is a static busybox installed in the guest's
	// /bin (a shell and the usual tools).
	Busybox string
	// MemSize is guest RAM (default 512 MiB); CPUs the vCPUs (default 1):
	// the size of a sandbox that asks for none (sandbox.Spec.Guest).
	MemSize uint64
	CPUs    int
	// DiskSize is the size of each sandbox's block device, /dev/vda
	// (default 64 MiB).
	DiskSize int64
	// StoreDir holds the chunk store of every sandbox's disk; each state
	// directory keeps its disk referenced there (state.go).
	StoreDir string
	// NoHostFilter starts machines without the host's nftables table for
	// vm networks (HostTable): a guest can then open connections to the
	// host's own addresses, and beyond where the host forwards. Only for
	// a host without nftables, such as the nested harness's L1, where
	// nothing else listens or forwards.
	NoHostFilter bool
}

// Runtime is the vm sandbox runtime: each sandbox is a Linux VM whose
// pid 1 is the guest agent, reached over vsock. Freeze and Thaw pause and
// resume the vCPUs; CopyState of a running sandbox seals its memory and
// snapshots its disk at one instant.
type Runtime struct {
	cfg    Config
	kernel []byte
	initrd []byte
	store  *chunkstore.Store
	gen    atomic.Uint64 // last generation given (see New)

	mu   sync.Mutex
	live map[string]*Instance // by Spec.Dir

	netMu    sync.Mutex
	nets     map[netip.Addr]bool // /30s given to running machines
	filtered bool                // the host's table is installed
}

// New reads the kernel and builds the guest's initramfs.
func New(cfg Config) (*Runtime, error) {
	if cfg.MemSize == 0 {
		cfg.MemSize = 512 << 20
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = 1
	}
	if cfg.DiskSize == 0 {
		cfg.DiskSize = 64 << 20
	}
	if cfg.Modules == "" {
		cfg.Modules = filepath.Dir(cfg.Kernel)
	}
	kernel, err := os.ReadFile(cfg.Kernel)
	if err != nil {
		return nil, fmt.Errorf("vm runtime: kernel (give --kernel, or run `make kernels`): %w", err)
	}
	agent, err := os.ReadFile(cfg.Agent)
	if err != nil {
		return nil, fmt.Errorf("vm runtime: guest agent (build cmd/tine-agent with CGO_ENABLED=0): %w", err)
	}
	var a initramfs
	a.file("init", 0o755, agent)
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "root"} {
		a.dir(d)
	}
	for _, m := range VirtioModules {
		b, err := os.ReadFile(filepath.Join(cfg.Modules, m+".ko"))
		if err != nil {
			return nil, fmt.Errorf("vm runtime: kernel module %s (run `make kernels`): %w", m, err)
		}
		a.file("lib/modules/tine/"+m+".ko", 0o644, b)
	}
	a.file("lib/modules/tine/order", 0o644, []byte(strings.Join(VirtioModules, "\n")+"\n"))
	if cfg.Busybox != "" {
		bb, err := os.ReadFile(cfg.Busybox)
		if err != nil {
			return nil, fmt.Errorf("vm runtime: busybox: %w", err)
		}
		a.file("bin/busybox", 0o755, bb)
	}
	store, err := chunkstore.Open(cfg.StoreDir, nil)
	if err != nil {
		return nil, fmt.Errorf("vm runtime: disk store: %w", err)
	}
	r := &Runtime{cfg: cfg, kernel: kernel, initrd: a.bytes(), store: store, live: map[string]*Instance{},
		nets: map[netip.Addr]bool{}}
	// Generations count from the clock in microseconds, so that a
	// guest cloned by a later daemon from an image an earlier one saved
	// never gets a generation given before (docs/fork-hygiene.md).
	r.gen.Store(uint64(time.Now().UnixMicro()))
	if _, err := r.GuestSize(nil); err != nil {
		store.Close()
		return nil, fmt.Errorf("vm runtime: default size: %w", err)
	}
	if err := r.pruneRefs(); err != nil {
		store.Close()
		return nil, err
	}
	return r, nil
}

// Name implements sandbox.Runtime.
func (r *Runtime) Name() string { return "vm" }

// CopyState implements sandbox.Runtime. From a running (frozen) sandbox
// it seals the machine's memory into an image directory and snapshots its
// disk, at one instant; from a state directory it shares the image's
// files (hard links: they are never written again) and the disk root.
// The new directory is built under a temporary name and renamed into
// place: after a crash it is absent or whole (state.go).
func (r *Runtime) CopyState(ctx context.Context, from, to string) error {
	if _, err := os.Lstat(to); err == nil {
		return fmt.Errorf("vm runtime: copy state to %s: it exists", to)
	}
	r.mu.Lock()
	in := r.live[from]
	r.mu.Unlock()
	return r.writeState(to, func(tmp string) (manifest, error) {
		if in == nil {
			m, err := readManifest(from)
			if err != nil {
				return m, err
			}
			if m.Image {
				if err := linkImage(filepath.Join(from, imageDir), filepath.Join(tmp, imageDir)); err != nil {
					return m, fmt.Errorf("vm runtime: copy the memory image of %s: %w", from, err)
				}
			}
			return m, nil
		}
		in.m.VM.Pause()
		defer in.m.VM.Resume()
		in.quiesceShare()
		root, err := in.disk.Snapshot()
		if err != nil {
			return manifest{}, fmt.Errorf("vm runtime: snapshot the disk of %s: %w", from, err)
		}
		mi, err := in.m.Seal()
		if err != nil {
			return manifest{}, fmt.Errorf("vm runtime: seal the memory of %s: %w", from, err)
		}
		defer mi.Close()
		if err := mi.SaveDir(filepath.Join(tmp, imageDir)); err != nil {
			return manifest{}, fmt.Errorf("vm runtime: save the memory of %s: %w", from, err)
		}
		mem, cpus := mi.Size()
		return manifest{Disk: root.String(), Image: true, MemoryBytes: int64(mem), CPUs: cpus}, nil
	})
}

// Start implements sandbox.Runtime: it boots the guest, or clones the
// memory image its state holds (written by this or an earlier process)
// as a new machine, and returns once the agent answered (after the
// fork-hygiene step for a clone).
func (r *Runtime) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	if spec.Seed != "" {
		if err := r.CopyState(ctx, spec.Seed, spec.Dir); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("vm runtime: %w", err)
	}
	man, err := readManifest(spec.Dir)
	if err != nil {
		return nil, err
	}
	var img *linux.MachineImage
	if man.Image {
		if img, err = linux.OpenMachineImage(filepath.Join(spec.Dir, imageDir)); err != nil {
			return nil, fmt.Errorf("vm runtime: %w (remove the sandbox, or roll it back to another snapshot)", err)
		}
		defer img.Close() // the clone keeps what it maps
	}
	size, err := r.GuestSize(spec.Guest)
	if err != nil {
		return nil, err
	}
	in := &Instance{r: r, dir: spec.Dir, done: make(chan struct{})}
	if man.Disk != "" {
		id, err := chunkstore.ParseID(man.Disk)
		if err != nil {
			return nil, fmt.Errorf("vm runtime: disk root in %s: %w", spec.Dir, err)
		}
		if in.disk, err = disk.Open(r.store, id); err != nil {
			return nil, fmt.Errorf("vm runtime: %w", err)
		}
	} else if in.disk, err = disk.New(r.store, r.cfg.DiskSize); err != nil {
		return nil, fmt.Errorf("vm runtime: %w", err)
	}
	console, err := os.OpenFile(filepath.Join(spec.Dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("vm runtime: %w", err)
	}
	in.console = console
	in.vsock = &virtio.Vsock{GuestCID: 3}
	exposeInsideAPI(in.vsock, spec.APISocket)
	devs := []virtio.Device{&virtio.RNG{}, &virtio.Console{}, &virtio.Block{Disk: in.disk}, in.vsock}
	// A network device of its own, on a TAP of its own, for every
	// machine: booted, cloned or restored (docs/fork-hygiene.md). An
	// image saved before machines had one is cloned without.
	if img == nil || len(img.DeviceTypes()) > netSlot && img.DeviceTypes()[netSlot] == virtio.TypeNet {
		if in.net, err = r.openNet(); err != nil {
			in.release()
			return nil, err
		}
		devs = append(devs, in.net.dev)
	}
	// The project share, after the network device; an image saved
	// before machines had one is cloned without.
	if err := in.addShare(spec, img); err != nil {
		in.release()
		return nil, err
	}
	if in.share != nil {
		devs = append(devs, in.share)
	}
	if img != nil {
		in.m, err = img.Clone(ctx, linux.MachineConfig{Console: console, Virtio: devs})
	} else {
		in.m, err = linux.NewMachine(ctx, linux.MachineConfig{Kernel: r.kernel, Initrd: r.initrd,
			MemSize: uint64(size.MemoryBytes), VCPUs: size.CPUs, Console: console, Virtio: devs,
			Cmdline: fmt.Sprintf("console=ttyS0 quiet panic=-1 -- --vsock %d --vm", AgentPort)})
	}
	if err != nil {
		in.release()
		return nil, fmt.Errorf("vm runtime: %w", err)
	}
	if err := in.listen(); err != nil {
		in.release()
		return nil, err
	}
	if in.net != nil {
		in.net.dev.Start(in.m.Virtio[netSlot])
	}
	in.kickShare()
	runCtx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() {
		in.runErr = in.m.Run(runCtx)
		close(in.done)
	}()
	r.mu.Lock()
	r.live[spec.Dir] = in
	r.mu.Unlock()
	// Before anything else runs in it: the guest's clock, RNG and
	// generation (docs/fork-hygiene.md). A booted guest gets the clock
	// and a generation too.
	if err := in.hygiene(ctx, r.gen.Add(1)); err != nil {
		in.Stop(context.Background())
		return nil, err
	}
	return in, nil
}

// netSlot is the network device's place among the machine's virtio
// devices (after rng, console, block and vsock).
const netSlot = 4

// Instance is one running vm sandbox.
type Instance struct {
	r       *Runtime
	dir     string
	m       *linux.Machine
	disk    *disk.Image
	vsock   *virtio.Vsock
	net     *guestNet
	share   *virtio.FS
	mount   *proto.ShareMount
	console *os.File
	bridge  net.Listener
	cancel  context.CancelFunc
	done    chan struct{}
	runErr  error
	stop    sync.Once
	stopErr error
}

// AgentSocket implements sandbox.Instance: a host Unix socket that
// speaks the guest agent protocol; each connection is bridged to the
// agent's vsock port.
func (in *Instance) AgentSocket() string { return filepath.Join(in.dir, "agent.sock") }

// VsockSocket is the host side of the VM's vsock device ("CONNECT PORT"
// reaches any guest port).
func (in *Instance) VsockSocket() string { return filepath.Join(in.dir, "vsock.sock") }

// GuestAddr is the guest's IPv4 address, on its own /30 in NetSubnet;
// invalid for a machine without a network device.
func (in *Instance) GuestAddr() netip.Addr {
	if in.net == nil {
		return netip.Addr{}
	}
	return in.net.guest
}

// HostAddr is the address of the host end of the machine's TAP, the
// guest's gateway.
func (in *Instance) HostAddr() netip.Addr {
	if in.net == nil {
		return netip.Addr{}
	}
	return in.net.host
}

// MAC is the guest's Ethernet address.
func (in *Instance) MAC() net.HardwareAddr {
	if in.net == nil {
		return nil
	}
	return in.net.mac
}

// TapName is the host's name of the machine's TAP interface.
func (in *Instance) TapName() string {
	if in.net == nil {
		return ""
	}
	return in.net.tap
}

// Freeze pauses every vCPU and waits for the project share's server to
// answer the requests in flight, so that a snapshot of the branch taken
// now holds every write the guest made.
func (in *Instance) Freeze(ctx context.Context) error {
	in.m.VM.Pause()
	in.quiesceShare()
	return nil
}

// Thaw resumes the vCPUs.
func (in *Instance) Thaw(ctx context.Context) error { in.m.VM.Resume(); return nil }

// Done is closed when the machine stopped (powered off, faulted, Stop).
func (in *Instance) Done() <-chan struct{} { return in.done }

// Stop ends the machine, records its disk in the sandbox's state (the
// next Start boots afresh from it), drops the memory image the machine
// was cloned from and closes its sockets.
func (in *Instance) Stop(ctx context.Context) error {
	in.stop.Do(func() {
		in.r.mu.Lock()
		if in.r.live[in.dir] == in {
			delete(in.r.live, in.dir)
		}
		in.r.mu.Unlock()
		if in.cancel != nil {
			in.cancel()
			<-in.done
		}
		root, err := in.disk.Snapshot()
		in.release()
		if err == nil {
			err = in.r.stopped(in.dir, root)
		}
		in.stopErr = err
	})
	return in.stopErr
}

func (in *Instance) release() {
	if in.bridge != nil {
		in.bridge.Close()
	}
	if in.vsock != nil {
		in.vsock.Close()
	}
	if in.net != nil {
		in.r.closeNet(in.net)
	}
	in.closeShare()
	if in.m != nil {
		in.m.Close()
	}
	if in.disk != nil {
		in.disk.Close()
	}
	if in.console != nil {
		in.console.Close()
	}
}

// listen opens the vsock device's socket and the agent bridge.
func (in *Instance) listen() error {
	for _, p := range []string{in.VsockSocket(), in.AgentSocket()} {
		os.Remove(p)
	}
	t := in.m.Virtio[3]
	if err := in.vsock.Listen(t, in.VsockSocket()); err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	l, err := net.Listen("unix", in.AgentSocket())
	if err != nil {
		return fmt.Errorf("vm runtime: agent socket: %w", err)
	}
	in.bridge = l
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go in.bridgeConn(c)
		}
	}()
	return nil
}

// bridgeConn joins a host connection to the agent's vsock port.
func (in *Instance) bridgeConn(c net.Conn) {
	defer c.Close()
	v, err := DialGuest(in.VsockSocket(), AgentPort, 10*time.Second)
	if err != nil {
		return
	}
	defer v.Close()
	go func() {
		io.Copy(v, c)
		if u, ok := v.(*net.UnixConn); ok {
			u.CloseWrite()
		}
	}()
	io.Copy(c, v)
}

// DialGuest connects to a guest vsock port through a VM's vsock socket:
// it sends "CONNECT PORT" and reads the "OK" line a byte at a time, so
// that what the guest sends first stays in the connection.
func DialGuest(sock string, port uint32, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("unix", sock, timeout)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(timeout))
	fmt.Fprintf(c, "CONNECT %d\n", port)
	var line []byte
	b := make([]byte, 1)
	for len(line) < 64 {
		if _, err := c.Read(b); err != nil {
			c.Close()
			return nil, fmt.Errorf("vsock port %d through %s: %w", port, sock, err)
		}
		if b[0] == '\n' {
			break
		}
		line = append(line, b[0])
	}
	if !strings.HasPrefix(string(line), "OK ") {
		c.Close()
		return nil, fmt.Errorf("vsock port %d through %s: answered %q", port, sock, line)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// hygiene waits for the agent and sends it the fork-hygiene step.
func (in *Instance) hygiene(ctx context.Context, gen uint64) error {
	var last error
	deadline := time.Now().Add(StartTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-in.done:
			return fmt.Errorf("vm runtime: the machine stopped before its agent answered (%v); see %s", in.runErr, filepath.Join(in.dir, "console.log"))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		c, err := client.Dial(dctx, in.AgentSocket())
		if err == nil {
			ent := make([]byte, 64)
			rand.Read(ent)
			req := proto.HygieneRequest{Entropy: ent, Now: time.Now(), Generation: gen, Share: in.mount}
			if in.net != nil {
				req.Net = in.net.hygiene()
			}
			err = c.Hygiene(dctx, req)
			c.Close()
			cancel()
			if err == nil {
				return nil
			}
			if ae := (*client.AgentError)(nil); errors.As(err, &ae) {
				// The agent answered: trying again would not help.
				return fmt.Errorf("vm runtime: fork hygiene: %w", err)
			}
		} else {
			cancel()
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("vm runtime: the guest agent did not answer within %v: %w", StartTimeout, last)
}

// StartTimeout bounds how long Start waits for the guest agent (a boot
// under the nested harness's emulation takes minutes).
var StartTimeout = 5 * time.Minute

var _ sandbox.Runtime = (*Runtime)(nil)
