package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"tine/guestagent/proto"
)

// extra is the Manager's state for services, logs, snapshot labels,
// promotions under way and recovery.
type extra struct {
	mu   sync.Mutex
	logs map[string]*logFile
	// labels makes the check that a sandbox's snapshot label is free
	// and the write of the labelled snapshot one step.
	labels nameLocks
	// recovered lists what Open found half-made and cleaned up.
	recovered []string
	// promoting holds "sandbox NAME" and "directory DIR" for each
	// promotion under way (claimPromotion).
	promoting map[string]bool
}

// Limits on services, which are persisted with the sandbox's metadata.
const (
	maxServices     = 32
	maxServiceBytes = 16 << 10
)

// LogCap is the most bytes a sandbox's service log holds on the host: the
// log rotates once at LogCap/2, keeping the previous half, so what a
// sandbox prints never takes more host disk than this.
const LogCap = 8 << 20

// checkServices validates the shell commands of CreateOptions.Services.
func checkServices(svcs []string) error {
	if len(svcs) > maxServices {
		return fmt.Errorf("%d services, at most %d", len(svcs), maxServices)
	}
	for i, s := range svcs {
		switch {
		case strings.TrimSpace(s) == "":
			return fmt.Errorf("service %d is empty", i+1)
		case len(s) > maxServiceBytes:
			return fmt.Errorf("service %d is %d bytes, at most %d", i+1, len(s), maxServiceBytes)
		case strings.ContainsRune(s, 0):
			return fmt.Errorf("service %d holds a NUL byte", i+1)
		}
	}
	return nil
}

// inherit fills in what a new sandbox takes from its options or from the
// snapshot it starts from: its services and the host directory's base.
func (m *Manager) inherit(info *Info, o CreateOptions) error {
	if err := checkServices(o.Services); err != nil {
		return err
	}
	info.Services = o.Services
	if o.Dir != "" {
		info.HostBase = info.Origin
		info.GitBase = m.git.of(info.ProjectPath, info.Origin)
		return nil
	}
	s, err := m.createSnapshot(o)
	if err != nil {
		return err
	}
	if info.Services == nil {
		info.Services = s.Services
	}
	info.HostBase = s.HostBase
	info.GitBase = s.GitBase
	return nil
}

// logFor returns the service log of sandbox name.
func (m *Manager) logFor(name string) *logFile {
	m.ext.mu.Lock()
	defer m.ext.mu.Unlock()
	if m.ext.logs == nil {
		m.ext.logs = map[string]*logFile{}
	}
	lf := m.ext.logs[name]
	if lf == nil {
		done := make(chan struct{})
		close(done)
		lf = &logFile{path: filepath.Join(m.dir(name), "logs", "services.log"),
			changed: make(chan struct{}), done: done}
		m.ext.logs[name] = lf
	}
	return lf
}

// startServices runs the sandbox's services, each as sh -c in the project
// directory with the sandbox's environment, their output going to its log.
// A service that cannot be started is noted in the log; it does not fail
// the start. Services end with the sandbox and are not restarted when
// they exit.
func (m *Manager) startServices(ctx context.Context, info *Info, l *live) {
	if len(info.Services) == 0 {
		return
	}
	lf := m.logFor(info.Name)
	if err := lf.begin(l.inst.Done()); err != nil {
		return // no log: the directory is gone (the sandbox is being removed)
	}
	c, err := m.Agent(ctx, info.Name)
	if err != nil {
		lf.note("services not started: %v", err)
		return
	}
	for i, svc := range info.Services {
		sctx, cancel := context.WithCancel(context.Background())
		p, err := c.Exec(sctx, proto.ExecRequest{Argv: []string{"/bin/sh", "-c", svc},
			Env: m.commandEnv(info.Name, l, info.Env), Dir: info.ProjectPath})
		if err != nil {
			cancel()
			lf.note("service %d (%s) not started: %v", i+1, svc, err)
			continue
		}
		lf.note("service %d started, pid %d: %s", i+1, p.PID, svc)
		ended := make(chan struct{})
		go func() {
			select {
			case <-l.inst.Done():
			case <-ended:
			}
			cancel()
		}()
		go func() {
			defer close(ended)
			var wg sync.WaitGroup
			wg.Add(2)
			for _, r := range []io.Reader{p.Stdout, p.Stderr} {
				go func() { defer wg.Done(); io.Copy(lf, r) }()
			}
			wg.Wait()
			ex, err := p.Wait(context.Background())
			switch {
			case err != nil:
				lf.note("service %d ended: %v", i+1, err)
			case ex.Signal != 0:
				lf.note("service %d killed by signal %d", i+1, ex.Signal)
			default:
				lf.note("service %d exited with code %d", i+1, ex.Code)
			}
		}()
	}
}

// logFile is a sandbox's service log on the host: services.log, rotated
// to services.log.1 when it would pass LogCap/2. Every write wakes the
// readers that follow it.
type logFile struct {
	path    string
	mu      sync.Mutex
	f       *os.File
	size    int64
	gen     uint64          // rotations so far
	changed chan struct{}   // closed and replaced at each write
	done    <-chan struct{} // closed when the current run of the sandbox ends
}

// begin opens the log for a new run of the sandbox, which ends when done
// is closed. The file is opened again, since the sandbox may have been
// removed and made anew since the last run.
func (lf *logFile) begin(done <-chan struct{}) error {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.f != nil {
		lf.f.Close()
		lf.f = nil
	}
	if err := os.MkdirAll(filepath.Dir(lf.path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(lf.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	lf.f, lf.size, lf.done = f, st.Size(), done
	lf.wake()
	return nil
}

// forgetLog closes and drops the service log of a removed sandbox: the
// file went with the sandbox's directory, and an open descriptor would
// keep its space on disk.
func (m *Manager) forgetLog(name string) {
	m.ext.mu.Lock()
	lf := m.ext.logs[name]
	delete(m.ext.logs, name)
	m.ext.mu.Unlock()
	if lf == nil {
		return
	}
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.f != nil {
		lf.f.Close()
		lf.f = nil
	}
	lf.wake()
}

// wake tells the followers something changed. Caller holds lf.mu.
func (lf *logFile) wake() {
	close(lf.changed)
	lf.changed = make(chan struct{})
}

// note writes a line of the host's own into the log.
func (lf *logFile) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	msg = strings.ReplaceAll(msg, "\n", " ")
	lf.Write([]byte("[tine] " + msg + "\n"))
}

// Write appends p to the log, rotating first when it would pass half the
// cap. It never fails: output that cannot be kept is dropped.
func (lf *logFile) Write(p []byte) (int, error) {
	n := len(p)
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.f == nil {
		return n, nil
	}
	if len(p) > LogCap/2 {
		p = p[len(p)-LogCap/2:]
	}
	if lf.size+int64(len(p)) > LogCap/2 {
		lf.f.Close()
		lf.f = nil
		if err := os.Rename(lf.path, lf.path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, nil
		}
		f, err := os.OpenFile(lf.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return n, nil
		}
		lf.f, lf.size = f, 0
		lf.gen++
	}
	k, _ := lf.f.Write(p)
	lf.size += int64(k)
	lf.wake()
	return n, nil
}

// LogOptions says which part of a sandbox's service output to read.
type LogOptions struct {
	// Follow keeps the stream open for output written later, until ctx ends
	// or the sandbox stops.
	Follow bool
	// Tail, when positive, starts this many lines before the end.
	Tail int
}

// Logs returns the output of the sandbox's services (stdout and stderr
// together, in the order the host received it) and the host's own lines,
// marked "[tine]", saying when each started and ended. At most LogCap
// bytes are kept. Close the reader when done with it.
func (m *Manager) Logs(ctx context.Context, name string, o LogOptions) (io.ReadCloser, error) {
	if _, err := m.Get(name); err != nil {
		return nil, err
	}
	lf := m.logFor(name)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(lf.stream(ctx, pw, o)) }()
	return pr, nil
}

// stream writes the log to w as o asks.
func (lf *logFile) stream(ctx context.Context, w io.Writer, o LogOptions) error {
	lf.mu.Lock()
	gen, changed, done := lf.gen, lf.changed, lf.done
	old, _ := os.Open(lf.path + ".1")
	cur, _ := os.Open(lf.path)
	lf.mu.Unlock()
	closeAll := func() {
		if old != nil {
			old.Close()
		}
		if cur != nil {
			cur.Close()
		}
	}
	defer func() { closeAll() }()
	oldFrom, curFrom := int64(0), int64(0)
	if o.Tail > 0 {
		need := o.Tail
		if cur != nil {
			var got int
			curFrom, got = tailStart(cur, need)
			need -= got
		}
		if need > 0 && old != nil {
			oldFrom, _ = tailStart(old, need)
		} else if old != nil {
			old.Close()
			old = nil
		}
	}
	if old != nil {
		if _, err := io.Copy(w, io.NewSectionReader(old, oldFrom, 1<<62)); err != nil {
			return err
		}
	}
	off := curFrom
	copyCur := func() error {
		if cur == nil {
			return nil
		}
		n, err := io.Copy(w, io.NewSectionReader(cur, off, 1<<62))
		off += n
		return err
	}
	if err := copyCur(); err != nil || !o.Follow {
		return err
	}
	for {
		ended := false
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			ended = true
		case <-changed:
		}
		lf.mu.Lock()
		g := lf.gen
		changed = lf.changed
		lf.mu.Unlock()
		if g != gen || cur == nil {
			// Rotated: finish the file we had, then start the new one.
			if err := copyCur(); err != nil {
				return err
			}
			if cur != nil {
				cur.Close()
			}
			cur, _ = os.Open(lf.path)
			off, gen = 0, g
		}
		if err := copyCur(); err != nil {
			return err
		}
		if ended {
			return nil
		}
	}
}

// tailStart returns the offset in f where its last n lines start, and how
// many lines it found (fewer than n when the file is shorter). It reads
// the file backwards, a block at a time.
func tailStart(f *os.File, n int) (int64, int) {
	st, err := f.Stat()
	if err != nil {
		return 0, 0
	}
	end := st.Size()
	buf := make([]byte, 32<<10)
	found := 0
	pos := end
	for pos > 0 {
		k := min(int64(len(buf)), pos)
		pos -= k
		b := buf[:k]
		if _, err := f.ReadAt(b, pos); err != nil && !errors.Is(err, io.EOF) {
			return 0, found
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != '\n' || pos+int64(i) == end-1 {
				continue // a newline ending the file ends the last line
			}
			found++
			if found == n {
				return pos + int64(i) + 1, found
			}
		}
	}
	if end > 0 {
		found++ // the first line, which no newline precedes
	}
	return 0, min(found, n)
}
