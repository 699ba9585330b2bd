package sandbox

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"tine/guestagent/client"
	"tine/guestagent/proto"
)

// Agent returns a connection to the sandbox's guest agent (one per
// sandbox, made on first use).
func (m *Manager) Agent(ctx context.Context, name string) (*client.Client, error) {
	l, err := m.running(name)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.agent != nil {
		select {
		case <-l.agent.Done(): // closed (a write cut short), or dropped: dial again
			l.agent.Close()
			l.agent = nil
		default:
		}
	}
	if l.agent == nil {
		if l.agent, err = dialAgent(ctx, name, l); err != nil {
			return nil, err
		}
	}
	return l.agent, nil
}

// dialAgent makes a new connection to the agent of running sandbox l.
func dialAgent(ctx context.Context, name string, l *live) (*client.Client, error) {
	// The socket exists before the agent listens on it: retry briefly.
	for delay := 50 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		c, err := client.Dial(ctx, l.inst.AgentSocket())
		if err == nil {
			return c, nil
		}
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENAMETOOLONG) || errors.Is(err, syscall.ENOTSOCK) ||
			errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
			// A path no socket can be reached at: no retry would change it.
			return nil, fmt.Errorf("sandbox %q: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("sandbox %q: %w", name, err)
		case <-l.inst.Done():
			return nil, fmt.Errorf("sandbox %q: %w (its pid 1 ended)", name, ErrNotRunning)
		case <-time.After(delay):
		}
	}
}

// Exec starts a command in the sandbox. An empty req.Env takes the
// sandbox's Env, an empty req.Dir its project directory.
func (m *Manager) Exec(ctx context.Context, name string, req proto.ExecRequest) (*client.Process, error) {
	l, err := m.running(name)
	if err != nil {
		return nil, err
	}
	if len(req.Env) == 0 {
		req.Env = l.env
	}
	req.Env = m.commandEnv(name, l, req.Env)
	if req.Dir == "" {
		req.Dir = l.dir
	}
	if req.UID == nil && req.GID == nil && l.uid != nil {
		req.UID, req.GID = l.uid, l.gid
	}
	// The exec policy and the audit record: policy.go, audit.go.
	decided, err := m.checkExec(ctx, name, req)
	if err != nil {
		return nil, err
	}
	// Each command has a connection of its own while it runs: the
	// protocol has no flow control for output, so a caller that reads
	// one command's output slowly holds back that command only, not the
	// sandbox's other commands and requests. Once the command's exit has
	// come, nothing more of it can come on the connection, which serves
	// a later command.
	c := l.takeConn()
	if c == nil {
		if c, err = dialAgent(ctx, name, l); err != nil {
			return m.auditExec(name, req, decided, nil, err)
		}
	}
	// The OOM kills so far, for the exit to tell one during the command
	// (execOutcome): one small cgroup file read.
	var oom0 uint64
	counted := false
	if oc, ok := l.inst.(OOMCounter); ok {
		oom0, err = oc.OOMKills()
		counted = err == nil
	}
	p, err := c.Exec(ctx, req)
	if ae := (*client.AgentError)(nil); errors.As(err, &ae) && ae.ExitStatus() != 0 && !errors.Is(err, client.ErrClosed) {
		// The agent answered that the command did not start: the
		// connection is sound and serves a later command.
		err = &StartError{Sandbox: name, Argv: req.Argv, Code: ae.Code, Message: ae.Message}
		l.putConn(c)
	} else if err != nil {
		c.Close()
	} else {
		raw := p
		go func() {
			if _, err := raw.Wait(context.Background()); err != nil {
				c.Close()
				return
			}
			l.putConn(c)
		}()
		p = p.Outcome(m.execOutcome(name, l, p.PID, oom0, counted))
	}
	return m.auditExec(name, req, decided, p, err)
}

// StartError is a command that did not start in a sandbox for a reason
// its caller can act on, as a shell tells them apart: not found (exit
// status 127), not executable or no such working directory (126).
type StartError struct {
	Sandbox string
	Argv    []string
	// Code is the guest agent's: proto.CodeNotFound, CodeNotExecutable or
	// CodeBadDir.
	Code string
	// Message is the agent's; it names the command or the directory.
	Message string
}

func (e *StartError) Error() string { return fmt.Sprintf("sandbox %q: %s", e.Sandbox, e.Message) }

// ExitStatus is the exit status a shell gives the failure: 127 or 126.
func (e *StartError) ExitStatus() int { return proto.ExecExitStatus(e.Code) }

// maxIdleConns bounds the idle agent connections kept per sandbox.
const maxIdleConns = 4

// takeConn returns an idle agent connection that is still open, if
// there is one.
func (l *live) takeConn() *client.Client {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.idle) > 0 {
		c := l.idle[len(l.idle)-1]
		l.idle = l.idle[:len(l.idle)-1]
		select {
		case <-c.Done():
			c.Close() // dropped while idle
		default:
			return c
		}
	}
	return nil
}

// putConn keeps c for a later command, or closes it when enough are kept
// or the sandbox stopped.
func (l *live) putConn(c *client.Client) {
	l.mu.Lock()
	if !l.stopped && len(l.idle) < maxIdleConns {
		l.idle = append(l.idle, c)
		c = nil
	}
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}
