package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// An exposure forwards a host port to a port in a running sandbox: each
// connection the host accepts is matched by one the daemon makes inside
// the sandbox's network namespace (to its loopback), so that it works in
// every network mode, none included, and passes no packet filter. An
// exposure lasts while the sandbox runs; stopping the sandbox closes it.

// Exposure is one forwarded port.
type Exposure struct {
	// Port is the port in the sandbox.
	Port int `json:"port"`
	// HostAddress and HostPort are where the host listens.
	HostAddress string `json:"host_address"`
	HostPort    int    `json:"host_port"`
	// URL is an address a person can open.
	URL string `json:"url"`
	// Auto says the exposure was made by auto-expose.
	Auto bool `json:"auto,omitempty"`
}

// ExposeOptions says what to expose.
type ExposeOptions struct {
	Port int // in the sandbox (1-65535)
	// HostPort is the host's port (0: the same as Port when free,
	// otherwise any).
	HostPort int
	// Address is the host address to listen on (default 127.0.0.1).
	Address string
	auto    bool
}

// exposures are one sandbox's forwarded ports.
type exposures struct {
	netns  *os.File // the sandbox's network namespace, held open
	ports  map[int]*forward
	stop   context.CancelFunc // ends auto-expose; nil when off
	closed bool
}

// forward is one exposure's listener and connections.
type forward struct {
	Exposure
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (m *Manager) exposeFile(name string) string { return filepath.Join(m.dir(name), "expose.json") }

type exposeState struct {
	Auto bool `json:"auto"`
}

func (m *Manager) setAutoFile(name string, on bool) error {
	return writeJSON(m.exposeFile(name), exposeState{Auto: on})
}

// AutoExpose says whether a sandbox exposes every new listener.
func (m *Manager) AutoExpose(name string) bool {
	var st exposeState
	readJSON(m.exposeFile(name), &st)
	return st.Auto
}

// sandboxExposures returns the running sandbox's exposures, made on first
// use.
func (m *Manager) sandboxExposures(name string) (*exposures, error) {
	l, err := m.running(name)
	if err != nil {
		return nil, err
	}
	m.net.mu.Lock()
	defer m.net.mu.Unlock()
	if e := m.net.expo[name]; e != nil {
		return e, nil
	}
	np, ok := l.inst.(netPider)
	if !ok || np.NetPid() == 0 {
		return nil, fmt.Errorf("sandbox %q: runtime %s cannot expose ports", name, m.runtimeNameOf(name))
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", np.NetPid()))
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: its network namespace: %w", name, err)
	}
	if m.net.expo == nil {
		m.net.expo = map[string]*exposures{}
	}
	e := &exposures{netns: f, ports: map[int]*forward{}}
	m.net.expo[name] = e
	return e, nil
}

// Expose forwards a host port to a port of the running sandbox.
func (m *Manager) Expose(ctx context.Context, name string, o ExposeOptions) (*Exposure, error) {
	if o.Port < 1 || o.Port > 65535 || o.HostPort < 0 || o.HostPort > 65535 {
		return nil, fmt.Errorf("expose sandbox %q port %d (host port %d): %w", name, o.Port, o.HostPort, ErrBadPort)
	}
	if o.Address == "" {
		o.Address = "127.0.0.1"
	}
	addr, err := netip.ParseAddr(o.Address)
	if err != nil {
		return nil, fmt.Errorf("expose sandbox %q: host address %q: %w", name, o.Address, ErrBadPort)
	}
	e, err := m.sandboxExposures(name)
	if err != nil {
		return nil, err
	}
	m.net.mu.Lock()
	old := e.ports[o.Port]
	m.net.mu.Unlock()
	if old != nil {
		if o.HostPort == 0 || o.HostPort == old.HostPort {
			return &old.Exposure, nil
		}
		return nil, fmt.Errorf("sandbox %q: port %d is already exposed on %s; remove that first (tine expose %s %d --rm)", name, o.Port, old.URL, name, o.Port)
	}
	var ln net.Listener
	if o.HostPort == 0 {
		ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(o.Port)))
		if err != nil {
			ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), "0"))
		}
	} else {
		ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(o.HostPort)))
	}
	if err != nil {
		return nil, fmt.Errorf("expose sandbox %q port %d: listen on the host: %w (choose another --host-port)", name, o.Port, err)
	}
	hp := ln.Addr().(*net.TCPAddr).Port
	host := addr.String()
	if addr.IsUnspecified() {
		host = "127.0.0.1"
	}
	f := &forward{Exposure: Exposure{Port: o.Port, HostAddress: addr.String(), HostPort: hp,
		URL: "http://" + net.JoinHostPort(host, strconv.Itoa(hp)) + "/", Auto: o.auto}, ln: ln, conns: map[net.Conn]struct{}{}}
	m.net.mu.Lock()
	if e.closed || e.ports[o.Port] != nil {
		m.net.mu.Unlock()
		ln.Close()
		return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotRunning)
	}
	e.ports[o.Port] = f
	m.net.mu.Unlock()
	go m.serveForward(e, f)
	m.audit(name, "expose", map[string]any{"port": o.Port, "host": f.URL, "auto": o.auto})
	return &f.Exposure, nil
}

// ErrBadPort is returned for a port or host address that cannot be used.
var ErrBadPort = errors.New("bad port or address (ports are 1-65535)")

// Unexpose closes the exposure of a sandbox's port.
func (m *Manager) Unexpose(name string, port int) error {
	m.net.mu.Lock()
	e := m.net.expo[name]
	var f *forward
	if e != nil {
		f = e.ports[port]
		delete(e.ports, port)
	}
	m.net.mu.Unlock()
	if f == nil {
		if _, err := m.Get(name); err != nil {
			return err
		}
		return fmt.Errorf("sandbox %q: port %d is not exposed: %w", name, port, ErrNotFound)
	}
	f.close()
	m.audit(name, "unexpose", map[string]any{"port": port})
	return nil
}

// Exposures lists a sandbox's exposures by port.
func (m *Manager) Exposures(name string) ([]Exposure, error) {
	if _, err := m.Get(name); err != nil {
		return nil, err
	}
	out := []Exposure{}
	m.net.mu.Lock()
	if e := m.net.expo[name]; e != nil {
		for _, f := range e.ports {
			out = append(out, f.Exposure)
		}
	}
	m.net.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

// SetAutoExpose turns auto-expose on or off for a sandbox (kept across
// restarts). On, every new TCP listener of the running sandbox gets an
// exposure on the same host port when it is free, any other otherwise.
func (m *Manager) SetAutoExpose(ctx context.Context, name string, on bool) error {
	if _, err := m.Get(name); err != nil {
		return err
	}
	if err := m.setAutoFile(name, on); err != nil {
		return err
	}
	m.audit(name, "auto-expose", map[string]any{"on": on})
	if _, err := m.running(name); err != nil {
		return nil // applies at the next start
	}
	if on {
		return m.startAutoExpose(name)
	}
	m.net.mu.Lock()
	if e := m.net.expo[name]; e != nil && e.stop != nil {
		e.stop()
		e.stop = nil
	}
	m.net.mu.Unlock()
	return nil
}

// startAutoExpose starts the sandbox's auto-expose loop unless it runs.
func (m *Manager) startAutoExpose(name string) error {
	e, err := m.sandboxExposures(name)
	if err != nil {
		return err
	}
	m.net.mu.Lock()
	defer m.net.mu.Unlock()
	if e.stop != nil || e.closed {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	go m.autoExpose(ctx, name)
	return nil
}

// autoExposeEvery is how often auto-expose looks for new listeners.
const autoExposeEvery = 500 * time.Millisecond

// maxAutoExposures bounds the ports auto-expose opens on the host for one
// sandbox: each is a host listener (a descriptor and a goroutine), and a
// sandbox can listen on every port of its own network namespace.
const maxAutoExposures = 64

func (m *Manager) autoExpose(ctx context.Context, name string) {
	t := time.NewTicker(autoExposeEvery)
	defer t.Stop()
	seen := map[int]bool{}
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, err := m.Agent(ctx, name)
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ports, err := c.Ports(pctx)
		cancel()
		if err != nil {
			continue
		}
		for _, p := range ports {
			if p.Proto != "tcp" && p.Proto != "tcp6" || seen[int(p.Port)] {
				continue
			}
			seen[int(p.Port)] = true
			if m.autoExposures(name) >= maxAutoExposures {
				if !warned {
					warned = true
					fmt.Fprintf(os.Stderr, "tine: sandbox %s: auto-expose stops at %d ports; port %d and later listeners are not exposed (tine expose %s PORT exposes one)\n",
						name, maxAutoExposures, p.Port, name)
				}
				continue
			}
			if _, err := m.Expose(ctx, name, ExposeOptions{Port: int(p.Port), auto: true}); err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "tine: sandbox %s: auto-expose port %d: %v\n", name, p.Port, err)
			}
		}
	}
}

// autoExposures counts the sandbox's exposures that auto-expose made.
func (m *Manager) autoExposures(name string) int {
	m.net.mu.Lock()
	defer m.net.mu.Unlock()
	n := 0
	if e := m.net.expo[name]; e != nil {
		for _, f := range e.ports {
			if f.Auto {
				n++
			}
		}
	}
	return n
}

// stopExposures closes a sandbox's exposures (it stops).
func (m *Manager) stopExposures(name string) {
	m.net.mu.Lock()
	e := m.net.expo[name]
	delete(m.net.expo, name)
	if e != nil {
		e.closed = true
		if e.stop != nil {
			e.stop()
		}
	}
	m.net.mu.Unlock()
	if e == nil {
		return
	}
	for _, f := range e.ports {
		f.close()
	}
	e.netns.Close()
}

func (f *forward) close() {
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
}

func (f *forward) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forward) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

// maxForwardConns bounds one exposure's connections at once.
const maxForwardConns = 1024

func (m *Manager) serveForward(e *exposures, f *forward) {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		f.mu.Lock()
		n := len(f.conns)
		f.mu.Unlock()
		if n >= maxForwardConns || !f.track(c) {
			c.Close()
			continue
		}
		go func() {
			defer f.untrack(c)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			in, err := dialIn(ctx, e.netns, net.JoinHostPort("127.0.0.1", strconv.Itoa(f.Port)))
			cancel()
			if err != nil {
				return // the host side sees the connection closed
			}
			if !f.track(in) {
				in.Close()
				return
			}
			defer f.untrack(in)
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go pipe(in, c)
			go pipe(c, in)
			<-done
			<-done
		}()
	}
}

// dialIn connects to addr from inside the network namespace netns: the
// socket is made by a thread that joined it, and stays in it.
func dialIn(ctx context.Context, netns *os.File, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer self.Close()
		if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("join the sandbox's network namespace: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp4", addr)
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // otherwise the thread stays locked and ends with this goroutine
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}
