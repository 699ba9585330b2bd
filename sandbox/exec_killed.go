package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"tine/guestagent/client"
	"tine/guestagent/proto"
)

// OOMCounter is an Instance that counts the processes the kernel's OOM
// killer killed in it (the ns runtime, from its memory cgroup). Exec
// reads it when a command starts and when it ends, to tell an OOM kill
// (proto.KilledOOM) from another SIGKILL.
type OOMCounter interface {
	OOMKills() (uint64, error)
}

// oomSince reports whether the OOM killer killed a process in sandbox
// instance inst since its count was n0 (false when it cannot tell).
func oomSince(inst Instance, n0 uint64) bool {
	oc, ok := inst.(OOMCounter)
	if !ok {
		return false
	}
	n, err := oc.OOMKills()
	return err == nil && n > n0
}

// killCause is why the manager ended a sandbox: the proto.Exit.KilledBy
// and KilledReason of the commands running in it then.
type killCause struct{ by, reason string }

var (
	causeStopped = killCause{proto.KilledStopped, "the sandbox was stopped"}
	causeRemoved = killCause{proto.KilledRemoved, "the sandbox was removed"}
)

// causeLifetime is the cause of a removal past the sandbox's lifetime lt.
func causeLifetime(lt time.Duration) killCause {
	return killCause{proto.KilledLifetime, "the sandbox reached its --lifetime " + shortDuration(lt) + " and was removed"}
}

// shortDuration is d without the zero units Duration.String ends with
// (10m, not 10m0s).
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// sigkill is the signal that every kill from outside a command sends.
const sigkill = int(syscall.SIGKILL)

// execOutcome returns the proto.Exit filter of a command started in
// running sandbox l when its OOM count was oom0 (counted false: not
// known). It sets Exit.KilledBy when something outside the command
// killed it:
//
//   - proto.KilledOOM when the command ended by SIGKILL, or with status
//     137 (128+SIGKILL: how a shell reports a process it waited for
//     that SIGKILL killed), and the sandbox's OOM count rose while it
//     ran. Any OOM kill in the sandbox in that time counts, another
//     process's too.
//   - the sandbox's stop cause (stopped, removed, lifetime) when the
//     manager was stopping the sandbox as the command ended by SIGKILL
//     or its connection to the agent dropped with no exit: that exit
//     becomes SIGKILL (status 137) rather than an error. The same holds
//     when the sandbox's pid 1 ended by itself: the cause is then oom or
//     stopped (init_watch.go).
//
// A command killed by --timeout keeps TimedOut alone.
func (m *Manager) execOutcome(name string, l *live, pid int, oom0 uint64, counted bool) func(proto.Exit, error) (proto.Exit, error) {
	return func(ex proto.Exit, err error) (proto.Exit, error) {
		killed := err == nil && !ex.TimedOut && (ex.Signal == sigkill || ex.Signal == 0 && ex.Code == 128+sigkill)
		if killed && counted && oomSince(l.inst, oom0) {
			ex.KilledBy, ex.KilledReason = proto.KilledOOM, m.oomReason(name, ex.Signal == 0)
			return ex, nil
		}
		l.mu.Lock()
		cause := l.killed
		l.mu.Unlock()
		if cause == nil && err != nil && errors.Is(err, client.ErrClosed) {
			// The agent dropped the connection with no exit: did the
			// sandbox's pid 1 end (init_watch.go)?
			cause = m.initEnded(name, l)
		}
		if cause == nil || ex.TimedOut {
			return ex, err
		}
		if err == nil && ex.Signal != sigkill || err != nil && !errors.Is(err, client.ErrClosed) {
			return ex, err
		}
		return proto.Exit{PID: pid, Code: -1, Signal: sigkill, KilledBy: cause.by, KilledReason: cause.reason}, nil
	}
}

// oomReason words an OOM kill in sandbox name for a person; waited: the
// command's status was 137, a process it waited for was killed.
func (m *Manager) oomReason(name string, waited bool) string {
	s := "out of memory (the sandbox has no memory limit: the host or a parent cgroup ran out)"
	if info, err := m.Get(name); err == nil && info.Limits.MemoryBytes > 0 {
		s = "out of memory (memory limit " + sizeText(info.Limits.MemoryBytes) + ")"
	}
	if waited {
		s += ": a process it ran was killed"
	}
	return s
}

// sizeText words a byte count in the largest binary unit that divides it.
func sizeText(n int64) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
