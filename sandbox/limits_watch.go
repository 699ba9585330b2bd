package sandbox

import (
	"context"
	"fmt"
	"os"
	"time"

	"tine/guestagent/proto"
)

// watchState is what the watch loop remembers of a running sandbox.
type watchState struct {
	cpu        uint64    // CPU time at the last look
	oom        uint64    // OOM kills at the last look
	lastActive time.Time // last command started or ended, or CPU used
	execs      int       // commands running
	layerCPU   uint64    // CPU time at the last OS-layer check
	layerAt    time.Time // when that check was
	layer      int64     // what that check measured; -1 before the first
}

// layerEvery is how often a sandbox that used CPU since has its OS layer
// measured.
const layerEvery = 3 * time.Second

// watchEvery is how often the watch loop looks at the sandboxes.
const watchEvery = time.Second

// idleCPU is the CPU time per watchEvery under which a sandbox counts as
// idle (1% of one CPU): the agent's own bookkeeping stays below it.
const idleCPU = uint64(watchEvery / 100)

// HostEvent types, sent on the events stream beside the agent's.
const (
	EventOOMKill = "oom-kill"
	EventFrozen  = "frozen"
	EventThawed  = "thawed"
	// EventLayerFull: the sandbox's OS layer passed its bound and the
	// sandbox was frozen.
	EventLayerFull = "layer-full"
)

// startWatch runs the loop that removes sandboxes past their lifetime,
// freezes idle ones and reports OOM kills, until stopWatch.
func (m *Manager) startWatch() {
	m.pol.loopOnce.Do(func() {
		if err := m.Audit("", "open", map[string]any{"root": m.root, "pid": os.Getpid()}); err != nil {
			fmt.Fprintf(os.Stderr, "tine: audit: %v\n", err)
		}
		m.pol.stop, m.pol.done = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(m.pol.done)
			t := time.NewTicker(watchEvery)
			defer t.Stop()
			for {
				select {
				case <-m.pol.stop:
					return
				case <-t.C:
					m.watchOnce(context.Background(), time.Now())
				}
			}
		}()
	})
}

// stopWatch ends the loop and closes the audit logs.
func (m *Manager) stopWatch() {
	if m.pol.stop != nil {
		select {
		case <-m.pol.stop:
		default:
			close(m.pol.stop)
		}
		<-m.pol.done
	}
	m.Audit("", "close", map[string]any{"pid": os.Getpid()})
	m.closeAudit()
}

// watchOnce does one round of the loop.
func (m *Manager) watchOnce(ctx context.Context, now time.Time) {
	infos, err := m.List()
	if err != nil {
		return
	}
	for _, info := range infos {
		name := info.Name
		if lt := info.Limits.Lifetime; lt > 0 && now.After(info.Created.Add(lt)) {
			m.audit(name, "expire", map[string]any{"lifetime": lt.String(), "created": info.Created})
			if err := m.remove(ctx, name, causeLifetime(lt)); err != nil {
				fmt.Fprintf(os.Stderr, "tine: remove sandbox %q past its lifetime: %v\n", name, err)
			}
			continue
		}
		u, err := m.Usage(name)
		if err != nil {
			continue // not running
		}
		m.pol.mu.Lock()
		// A sandbox's cgroup counts OOM kills from 0: kills made before
		// the loop first saw it are reported too. The CPU it used before
		// counts as activity now.
		w := m.watchOf(name)
		oom := u.OOMKills - min(u.OOMKills, w.oom)
		w.oom = u.OOMKills
		if u.CPUNanos > w.cpu+idleCPU || w.execs > 0 {
			w.lastActive = now
		}
		w.cpu = u.CPUNanos
		idle := info.Limits.Idle > 0 && now.Sub(w.lastActive) >= info.Limits.Idle
		frozen := m.pol.frozen[name] != ""
		checkLayer := !frozen && u.CPUNanos != w.layerCPU && now.Sub(w.layerAt) >= layerEvery
		if checkLayer {
			w.layerCPU, w.layerAt = u.CPUNanos, now
		}
		m.pol.mu.Unlock()
		if checkLayer {
			m.checkLayer(ctx, info)
		}
		if oom > 0 {
			m.audit(name, "oom-kill", map[string]any{"kills": oom, "memory_limit": info.Limits.MemoryBytes,
				"memory_peak": u.MemoryPeak})
			m.publish(name, EventOOMKill)
		}
		if idle && !frozen {
			if err := m.freeze(ctx, name, "idle"); err == nil {
				m.audit(name, "freeze", map[string]any{"why": "idle", "idle": info.Limits.Idle.String()})
			}
		}
	}
}

// touch marks a sandbox active now (a command starts or ends), and thaws
// it when the manager froze it for being idle.
func (m *Manager) touch(name string) {
	m.pol.mu.Lock()
	if w := m.pol.watch[name]; w != nil {
		w.lastActive = time.Now()
	}
	idle := m.pol.frozen[name] == "idle"
	m.pol.mu.Unlock()
	if idle && m.thawIf(name, "idle") {
		m.audit(name, "thaw", map[string]any{"why": "a command"})
	}
}

// execStarted counts a running command for the idle clock; the returned
// function counts its end.
func (m *Manager) execStarted(name string) func() {
	m.pol.mu.Lock()
	m.watchOf(name).execs++
	m.pol.mu.Unlock()
	return func() {
		m.pol.mu.Lock()
		w := m.watchOf(name)
		w.execs = max(w.execs-1, 0)
		w.lastActive = time.Now()
		m.pol.mu.Unlock()
	}
}

// watchOf returns the watch state of sandbox name, made now if the loop
// has not looked at the sandbox yet: a command started in a sandbox's
// first second must count too, or the idle clock freezes it under the
// command. Caller holds pol.mu.
func (m *Manager) watchOf(name string) *watchState {
	if m.pol.watch == nil {
		m.pol.watch = map[string]*watchState{}
	}
	w := m.pol.watch[name]
	if w == nil {
		w = &watchState{lastActive: time.Now(), layer: -1}
		m.pol.watch[name] = w
	}
	return w
}

// Freeze stops every process of a running sandbox with the cgroup
// freezer until Thaw: it uses no CPU, and its processes, memory and
// sockets stay as they are. Commands are refused meanwhile.
func (m *Manager) Freeze(ctx context.Context, name string) error {
	const why = "frozen by a person"
	if err := m.freeze(ctx, name, why); err != nil {
		return err
	}
	// A person's freeze outlasts an idle one: no command thaws it.
	m.pol.mu.Lock()
	m.pol.frozen[name] = why
	m.pol.mu.Unlock()
	m.audit(name, "freeze", nil)
	return nil
}

// Thaw resumes a frozen sandbox.
func (m *Manager) Thaw(ctx context.Context, name string) error {
	l, err := m.running(name)
	if err != nil {
		return err
	}
	if err := l.inst.Thaw(ctx); err != nil {
		return fmt.Errorf("thaw sandbox %q: %w", name, err)
	}
	m.pol.mu.Lock()
	delete(m.pol.frozen, name)
	if w := m.pol.watch[name]; w != nil {
		w.lastActive = time.Now()
	}
	m.pol.mu.Unlock()
	m.audit(name, "thaw", nil)
	m.publish(name, EventThawed)
	return nil
}

// Frozen says why the manager froze the sandbox, or "" when it did not.
func (m *Manager) Frozen(name string) string { return m.frozenWhy(name) }

func (m *Manager) frozenWhy(name string) string {
	m.pol.mu.Lock()
	defer m.pol.mu.Unlock()
	return m.pol.frozen[name]
}

// freeze freezes a running sandbox, remembering why.
func (m *Manager) freeze(ctx context.Context, name, why string) error {
	l, err := m.running(name)
	if err != nil {
		return err
	}
	if err := l.inst.Freeze(ctx); err != nil {
		return fmt.Errorf("freeze sandbox %q: %w", name, err)
	}
	m.pol.mu.Lock()
	if m.pol.frozen == nil {
		m.pol.frozen = map[string]string{}
	}
	if m.pol.frozen[name] == "" {
		m.pol.frozen[name] = why
	}
	m.pol.mu.Unlock()
	m.publish(name, EventFrozen)
	return nil
}

// thawIf thaws the sandbox if it is frozen for why; it reports whether it
// did.
func (m *Manager) thawIf(name, why string) bool {
	m.pol.mu.Lock()
	if m.pol.frozen[name] != why {
		m.pol.mu.Unlock()
		return false
	}
	delete(m.pol.frozen, name)
	m.pol.mu.Unlock()
	l, err := m.running(name)
	if err != nil {
		return false
	}
	if err := l.inst.Thaw(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "tine: thaw sandbox %q: %v\n", name, err)
		return false
	}
	m.publish(name, EventThawed)
	return true
}

// forget drops what the manager keeps of a sandbox that stopped.
func (m *Manager) forgetWatch(name string) {
	m.pol.mu.Lock()
	delete(m.pol.watch, name)
	delete(m.pol.frozen, name)
	delete(m.pol.policies, name)
	m.pol.mu.Unlock()
}

// HostEvents returns a channel of the events the host sees about a
// sandbox (OOM kills, freezes), until ctx ends. A slow reader misses
// events rather than stalling the daemon.
func (m *Manager) HostEvents(ctx context.Context, name string) <-chan proto.Event {
	ch := make(chan proto.Event, 64)
	m.pol.mu.Lock()
	if m.pol.subs == nil {
		m.pol.subs = map[string]map[chan proto.Event]bool{}
	}
	if m.pol.subs[name] == nil {
		m.pol.subs[name] = map[chan proto.Event]bool{}
	}
	m.pol.subs[name][ch] = true
	m.pol.mu.Unlock()
	go func() {
		<-ctx.Done()
		m.pol.mu.Lock()
		delete(m.pol.subs[name], ch)
		if len(m.pol.subs[name]) == 0 {
			delete(m.pol.subs, name)
		}
		m.pol.mu.Unlock()
		close(ch)
	}()
	return ch
}

// publish sends a host event to a sandbox's subscribers.
func (m *Manager) publish(name, typ string) {
	ev := proto.Event{Type: typ, Time: time.Now().UTC()}
	m.pol.mu.Lock()
	defer m.pol.mu.Unlock()
	for ch := range m.pol.subs[name] {
		select {
		case ch <- ev:
		default:
		}
	}
}

// checkLayer measures a sandbox's OS layer, remembers it for Usage, and
// freezes the sandbox when the layer is over its bound.
func (m *Manager) checkLayer(ctx context.Context, info *Info) {
	lv, err := m.running(info.Name)
	if err != nil {
		return
	}
	lim, ok := lv.inst.(Limiter)
	if !ok {
		return
	}
	bound := info.Limits.LayerBytes
	if bound == 0 {
		bound = DefaultLayerBytes
	}
	n, err := lim.LayerBytes(bound)
	if err != nil {
		return
	}
	m.pol.mu.Lock()
	if w := m.pol.watch[info.Name]; w != nil {
		w.layer = n
	}
	m.pol.mu.Unlock()
	if n <= bound {
		return
	}
	if err := m.freeze(ctx, info.Name, "over its OS-layer bound"); err != nil {
		return
	}
	m.audit(info.Name, "layer-full", map[string]any{"bytes": n, "layer_bytes": bound})
	m.publish(info.Name, EventLayerFull)
}
