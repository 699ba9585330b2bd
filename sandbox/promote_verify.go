package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"tine/cowfs"
	"tine/guestagent/proto"
)

// VerifyOptions is the check a promotion runs before it writes anything:
// Command (sh -c, in the project directory) on the result the promotion
// would write, in a sandbox of its own made for the check.
type VerifyOptions struct {
	// Command is the check; empty: none.
	Command string
	// Timeout, when positive, kills the check after that long (it fails).
	Timeout time.Duration
	// Keep leaves the verification sandbox for inspection (its name is in
	// the result); by default it is removed once the check ends.
	Keep bool
}

// VerifyResult is a check's outcome, kept in the promotion's record.
type VerifyResult struct {
	Command string `json:"command"`
	// ExitCode is the check's exit status (-1 when a signal ended it).
	ExitCode int  `json:"exit_code"`
	Signal   int  `json:"signal,omitempty"`
	TimedOut bool `json:"timed_out,omitempty"`
	// KilledBy and KilledReason say what outside the check killed it
	// (proto.Exit's: oom when it passed the sandbox's memory limit).
	KilledBy     string `json:"killed_by,omitempty"`
	KilledReason string `json:"killed_reason,omitempty"`
	Passed       bool   `json:"passed"`
	// Output is the last VerifyOutputMax bytes of the check's standard
	// output and error, interleaved as they came; OutputBytes counts all
	// of it and Truncated says whether the start was dropped.
	Output      string `json:"output"`
	OutputBytes int64  `json:"output_bytes"`
	Truncated   bool   `json:"truncated,omitempty"`
	// Tree is the cowfs snapshot the check ran on: what the promotion
	// writes.
	Tree string `json:"tree"`
	// Sandbox names the verification sandbox when it was kept.
	Sandbox string  `json:"sandbox,omitempty"`
	Seconds float64 `json:"seconds"`
}

// VerifyOutputMax bounds the output a check's record keeps (its end).
const VerifyOutputMax = 64 << 10

// ErrVerifyFailed reports a promotion whose check did not exit 0; nothing
// was written.
var ErrVerifyFailed = errors.New("the verification check failed")

// verify runs check o on project tree in a new sandbox made for it from
// parent's settings (project path, environment, limits), with a fresh OS
// layer and no network: the sandbox being promoted cannot change what the
// check runs with, only the project it is given. The tree's branch is a
// branch of the store, not a copy. A check that does not pass returns an
// error wrapping ErrVerifyFailed along with its result.
func (m *Manager) verify(ctx context.Context, parent *Info, tree cowfs.SnapshotID, o VerifyOptions) (*VerifyResult, error) {
	res := &VerifyResult{Command: o.Command, Tree: tree.String(), ExitCode: -1}
	start := time.Now()
	defer func() { res.Seconds = time.Since(start).Seconds() }()
	name, err := m.verifyName(parent.Name)
	if err != nil {
		return res, err
	}
	info := &Info{Name: name, Runtime: m.rt.Name(), State: Stopped, Branch: branchName(name),
		Created: time.Now().UTC(), Limits: parent.Limits, Env: parent.Env, ProjectPath: parent.ProjectPath,
		From: parent.Name, Origin: tree.String()}
	made := false
	defer func() {
		if made && !o.Keep {
			m.Remove(context.WithoutCancel(ctx), name)
		}
	}()
	if err := os.Mkdir(m.dir(name), 0o700); err != nil {
		return res, fmt.Errorf("verification sandbox: %w", err)
	}
	made = true
	if err := m.fs.Branch(ctx, tree, info.Branch); err != nil {
		return res, fmt.Errorf("verification sandbox %q: %w", name, err)
	}
	if info.Limits.ProjectBytes > 0 {
		if err := m.fs.SetQuota(ctx, info.Branch, info.Limits.ProjectBytes); err != nil {
			return res, fmt.Errorf("verification sandbox %q: %w", name, err)
		}
	}
	if err := m.start(ctx, info, ""); err != nil {
		return res, fmt.Errorf("verification sandbox: %w", err)
	}
	if o.Keep {
		res.Sandbox = name
	}
	p, err := m.Exec(ctx, name, proto.ExecRequest{Argv: []string{"sh", "-c", o.Command}, Dir: info.ProjectPath, Timeout: o.Timeout})
	if err != nil {
		return res, fmt.Errorf("run the check %q in sandbox %q: %w", o.Command, name, err)
	}
	p.Stdin.Close()
	out := &tailBuffer{max: VerifyOutputMax}
	var wg sync.WaitGroup
	for _, r := range []io.Reader{p.Stdout, p.Stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(out, r)
		}()
	}
	ex, err := p.Wait(ctx)
	wg.Wait()
	res.Output, res.OutputBytes, res.Truncated = out.String(), out.total, out.total > int64(len(out.buf))
	if err != nil {
		return res, fmt.Errorf("run the check %q in sandbox %q: %w", o.Command, name, err)
	}
	res.ExitCode, res.Signal, res.TimedOut = ex.Code, ex.Signal, ex.TimedOut
	res.KilledBy, res.KilledReason = ex.KilledBy, ex.KilledReason
	res.Passed = ex.Code == 0 && ex.Signal == 0 && !ex.TimedOut
	if !res.Passed {
		how := fmt.Sprintf("exit status %d", ex.Code)
		switch {
		case ex.TimedOut:
			how = fmt.Sprintf("timed out after %s", o.Timeout)
		case ex.KilledBy != "":
			how = "killed: " + ex.KilledReason
		case ex.Signal != 0:
			how = fmt.Sprintf("killed by signal %d", ex.Signal)
		}
		return res, fmt.Errorf("check %q: %s (its output is in the promotion's record): %w", o.Command, how, ErrVerifyFailed)
	}
	return res, nil
}

// verifyName picks an unused name for a verification sandbox of sandbox
// name.
func (m *Manager) verifyName(name string) (string, error) {
	var rnd [4]byte
	rand.Read(rnd[:])
	suffix := ".verify-" + hex.EncodeToString(rnd[:])
	if len(name)+len(suffix) > 63 {
		name = name[:63-len(suffix)]
	}
	n := name + suffix
	if !nameRE().MatchString(n) {
		return "", fmt.Errorf("verification sandbox: bad name %q", n)
	}
	return n, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	total int64
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(len(p))
	n := len(p)
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if drop := len(t.buf) + len(p) - t.max; drop > 0 {
		t.buf = append(t.buf[:0], t.buf[drop:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// PromoteRecord is what the state root keeps of a verified promotion
// (promote/records/SB/TIME.json), whether it was applied or not.
type PromoteRecord struct {
	Sandbox string    `json:"sandbox"`
	Time    time.Time `json:"time"`
	// Dir is the directory promoted into; Branch and Commit the git
	// branch and commit (a promotion to git).
	Dir     string        `json:"dir,omitempty"`
	Branch  string        `json:"branch,omitempty"`
	Commit  string        `json:"commit,omitempty"`
	DryRun  bool          `json:"dry_run,omitempty"`
	Applied bool          `json:"applied"`
	Verify  *VerifyResult `json:"verify,omitempty"`
	Error   string        `json:"error,omitempty"`
	// Path is where the record is kept.
	Path string `json:"-"`
}

// recordPromotion writes r under the state root and returns its path.
func (m *Manager) recordPromotion(r *PromoteRecord) error {
	dir := filepath.Join(m.root, "promote", "records", r.Sandbox)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("promotion record: %w", err)
	}
	r.Time = time.Now().UTC()
	r.Path = filepath.Join(dir, r.Time.Format("20060102T150405.000000000Z")+".json")
	return writeJSON(r.Path, r)
}

// PromoteRecords returns the records of sandbox name's verified
// promotions, oldest first.
func (m *Manager) PromoteRecords(name string) ([]*PromoteRecord, error) {
	if !nameRE().MatchString(name) {
		return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
	}
	dir := filepath.Join(m.root, "promote", "records", name)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*PromoteRecord
	for _, e := range ents {
		var r PromoteRecord
		if err := readJSON(filepath.Join(dir, e.Name()), &r); err != nil {
			return nil, err
		}
		r.Path = filepath.Join(dir, e.Name())
		out = append(out, &r)
	}
	return out, nil
}
