package sandbox

import (
	"context"
	"time"

	"tine/guestagent/proto"
)

// A sandbox whose pid 1 (the guest agent, or a vm's machine) ends by
// itself, with no stop asked for, is stopped as tine stop would stop it:
// what is left of its processes is killed, its project unmounted and its
// state saved as Stopped, with the reason in Info.StopReason. The kernel's
// OOM killer is the usual cause: a command that fills the sandbox's
// memory limit can take its agent with it. Its commands then end with
// signal 9 and KilledBy oom (or stopped), not a dropped connection.

// watchInit stops the sandbox name once pid 1 of its run l ends, unless
// the manager is already stopping that run.
func (m *Manager) watchInit(name string, l *live) {
	<-l.inst.Done()
	l.mu.Lock()
	stopping := l.stopped
	l.mu.Unlock()
	if stopping {
		return
	}
	cause := m.initEndCause(name, l)
	m.stopRun(context.Background(), name, l, cause)
}

// initEndCause is why run l of sandbox name ended when its pid 1 did
// by itself.
func (m *Manager) initEndCause(name string, l *live) killCause {
	l.mu.Lock()
	oom0, counted := l.oom0, l.oomCounted
	l.mu.Unlock()
	if counted && oomSince(l.inst, oom0) {
		return killCause{proto.KilledOOM, m.oomReason(name, false) + ": the sandbox's pid 1 (its guest agent) was killed, and the sandbox stopped"}
	}
	return killCause{proto.KilledStopped, "the sandbox's pid 1 (its guest agent) ended, and the sandbox stopped"}
}

// initEndWait bounds how long a command whose connection to the agent
// dropped waits for the sandbox's pid 1 to be seen ending, to tell a
// dead sandbox from a dropped connection.
const initEndWait = time.Second

// initEnded returns the cause when run l's pid 1 ended (or ends within
// initEndWait) with no stop asked for, nil otherwise.
func (m *Manager) initEnded(name string, l *live) *killCause {
	select {
	case <-l.inst.Done():
	case <-time.After(initEndWait):
		return nil
	}
	l.mu.Lock()
	cause := l.killed
	l.mu.Unlock()
	if cause != nil {
		return cause
	}
	c := m.initEndCause(name, l)
	return &c
}
