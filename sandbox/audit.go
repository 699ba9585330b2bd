package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"tine/audit"
	"tine/gateway"
	"tine/guestagent/client"
	"tine/guestagent/proto"
)

// policyState is the Manager's audit logs, exec policies, approvals and
// the loop keeping lifetimes, idle freezes and OOM reports.
type policyState struct {
	mu        sync.Mutex
	logs      map[string]*audit.Log // "" is the daemon's
	policies  map[string]*policyEntry
	approvals map[string]*Approval
	waiters   map[string]chan bool
	frozen    map[string]string // sandbox -> why the manager froze it
	watch     map[string]*watchState
	subs      map[string]map[chan proto.Event]bool
	loopOnce  sync.Once
	stop      chan struct{}
	done      chan struct{}
	// limits serializes changes of limits (limits.go), so that a raise
	// computed from the current limits is applied to those limits.
	limits sync.Mutex
}

// auditDir is where the audit logs live: they outlive their sandboxes.
func (m *Manager) auditDir() string { return filepath.Join(m.root, "audit") }

// AuditPath returns the path of a sandbox's audit log, or of the
// daemon's when name is "".
func (m *Manager) AuditPath(name string) (string, error) {
	if name == "" {
		return filepath.Join(m.auditDir(), "daemon.jsonl"), nil
	}
	if !nameRE().MatchString(name) {
		return "", fmt.Errorf("audit log of sandbox %q: %w", name, ErrNotFound)
	}
	return filepath.Join(m.auditDir(), "sandboxes", name+".jsonl"), nil
}

// AuditLog returns the open audit log of a sandbox (name "" for the
// daemon's), opened on first use. Other parts of the daemon append their
// records to it (kind, fields).
func (m *Manager) AuditLog(name string) (*audit.Log, error) {
	p, err := m.AuditPath(name)
	if err != nil {
		return nil, err
	}
	m.pol.mu.Lock()
	defer m.pol.mu.Unlock()
	if l := m.pol.logs[name]; l != nil {
		return l, nil
	}
	l, err := audit.Open(p)
	if err != nil {
		return nil, err
	}
	if m.pol.logs == nil {
		m.pol.logs = map[string]*audit.Log{}
	}
	m.pol.logs[name] = l
	return l, nil
}

// Audit appends a record to a sandbox's audit log (name "" for the
// daemon's).
func (m *Manager) Audit(name, kind string, fields map[string]any) error {
	for try := 0; ; try++ {
		l, err := m.AuditLog(name)
		if err != nil {
			return err
		}
		// A log closed by forgetAudit in between opens again.
		if err = l.Append(kind, fields); try == 1 || !errors.Is(err, audit.ErrClosed) {
			return err
		}
	}
}

// forgetAudit closes the open audit log of sandbox name. A removed
// sandbox's log stays on disk, its history, but holds no descriptor; it
// opens again when anything appends to it or follows it.
func (m *Manager) forgetAudit(name string) {
	// Closed under the lock: the log cannot open again (and chain on
	// from the file) while an append to this one may still come.
	m.pol.mu.Lock()
	defer m.pol.mu.Unlock()
	if l := m.pol.logs[name]; l != nil {
		l.Close()
		delete(m.pol.logs, name)
	}
}

// audit records an operation on sandbox name in its log and in the
// daemon's. A failure to record is written to standard error: the
// operation is done by then.
func (m *Manager) audit(name, kind string, fields map[string]any) {
	if fields == nil {
		fields = map[string]any{}
	}
	err := m.Audit(name, kind, fields)
	df := make(map[string]any, len(fields)+1)
	for k, v := range fields {
		df[k] = v
	}
	df["sandbox"] = name
	err = errors.Join(err, m.Audit("", kind, df))
	if m.net.opts.Audit != nil {
		err = errors.Join(err, m.net.opts.Audit.Append(kind, df))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tine: audit %s of sandbox %q: %v\n", kind, name, err)
	}
}

// closeAudit closes the open logs.
func (m *Manager) closeAudit() {
	m.pol.mu.Lock()
	defer m.pol.mu.Unlock()
	for _, l := range m.pol.logs {
		l.Close()
	}
	m.pol.logs = nil
}

// counter counts the bytes read through it.
type counter struct {
	r   io.Reader
	n   atomic.Int64
	eof chan struct{}
	o   sync.Once
}

func (c *counter) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	if err != nil {
		c.o.Do(func() { close(c.eof) })
	}
	return n, err
}

// auditExec records an exec: at once when it did not start, else when it
// has exited and its output was read (or 5 seconds after its exit), with
// its exit, duration and output bytes.
func (m *Manager) auditExec(name string, req proto.ExecRequest, d string, p *client.Process, err error) (*client.Process, error) {
	user := uint32(0)
	if req.UID != nil {
		user = *req.UID
	}
	fields := map[string]any{"argv": req.Argv, "cwd": req.Dir, "uid": user, "tty": req.TTY, "policy": d}
	if err != nil {
		fields["error"] = err.Error()
		if se := (*StartError)(nil); errors.As(err, &se) {
			fields["exit_code"] = se.ExitStatus() // what a shell would give
		}
		m.Audit(name, "exec", fields)
		return p, err
	}
	start := time.Now()
	so := &counter{r: p.Stdout, eof: make(chan struct{})}
	se := &counter{r: p.Stderr, eof: make(chan struct{})}
	p.Stdout, p.Stderr = so, se
	fields["pid"] = p.PID
	ended := m.execStarted(name)
	go func() {
		ex, werr := p.Wait(context.Background())
		ended()
		dur := time.Since(start)
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		for _, c := range []*counter{so, se} {
			select {
			case <-c.eof:
			case <-t.C:
			}
		}
		fields["duration_ms"] = dur.Milliseconds()
		fields["stdout_bytes"] = so.n.Load()
		fields["stderr_bytes"] = se.n.Load()
		if werr != nil {
			fields["error"] = werr.Error()
		} else {
			fields["exit_code"] = ex.Code
			if ex.Signal != 0 {
				fields["signal"] = ex.Signal
			}
			if ex.TimedOut {
				fields["timed_out"] = true
			}
			if ex.KilledBy != "" {
				fields["killed_by"] = ex.KilledBy
			}
		}
		if err := m.Audit(name, "exec", fields); err != nil {
			fmt.Fprintf(os.Stderr, "tine: audit exec of sandbox %q: %v\n", name, err)
		}
	}()
	return p, nil
}

// netAuditor is where a sandbox's gateway records its events
// (credentialed requests, policy changes, denied connections): the
// sandbox's audit log and the daemon's, and the network options'
// auditor when set (see audit).
func (m *Manager) netAuditor(name string) gateway.Auditor {
	return auditorFunc(func(kind string, fields map[string]any) error {
		m.audit(name, kind, fields)
		return nil
	})
}

// auditorFunc is a gateway.Auditor made of a function.
type auditorFunc func(kind string, fields map[string]any) error

// Append calls the function.
func (f auditorFunc) Append(kind string, fields map[string]any) error { return f(kind, fields) }
