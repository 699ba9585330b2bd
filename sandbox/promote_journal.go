package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"tine/cowfs"
	"tine/internal/atomicfile"
)

// journal is the record of a promotion under way, written (and synced)
// before its first write to the host and removed once it is complete or
// undone. It names both ends (ours: the host before, merged: the host
// after), so that either can be reached from any state a crash leaves,
// and the process whose temporary entries may lie about.
type journal struct {
	Sandbox string    `json:"sandbox"`
	Dir     string    `json:"dir"`
	Ours    string    `json:"ours"`
	Merged  string    `json:"merged"`
	Theirs  string    `json:"theirs"`
	Partial bool      `json:"partial,omitempty"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// The options the apply ran with, so that a resume writes the same.
	Privileges cowfs.HostPrivileges `json:"privileges"`
	Umask      *uint32              `json:"umask,omitempty"`
}

func (m *Manager) journalPath(name string) string {
	return filepath.Join(m.root, "promote", name+".json")
}

func (m *Manager) writeJournal(j *journal) error {
	j.PID, j.Started = os.Getpid(), time.Now().UTC()
	p := m.journalPath(j.Sandbox)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("promotion journal: %w", err)
	}
	if err := writeJSON(p, j); err != nil {
		return fmt.Errorf("promotion journal: %w", err)
	}
	return nil
}

// readJournal returns sandbox name's journal, or nil when it has none.
func (m *Manager) readJournal(name string) (*journal, error) {
	var j journal
	err := readJSON(m.journalPath(name), &j)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &j, nil
}

// dropJournal removes a journal. The snapshots it names stay: being
// content-addressed, the same id may be another sandbox's base.
func (m *Manager) dropJournal(ctx context.Context, j *journal) {
	os.Remove(m.journalPath(j.Sandbox))
	atomicfile.SyncDir(filepath.Dir(m.journalPath(j.Sandbox)))
}

// ResumePromote finishes a promotion of sandbox name that stopped partway
// (see Promote): every path still as the host had it is written, those
// already written are left alone, and the temporary entries of the
// stopped process are removed. A path that matches neither side (changed
// by someone since) is a conflict and nothing is written.
func (m *Manager) ResumePromote(ctx context.Context, name string) (*PromoteResult, error) {
	return m.endJournal(ctx, name, false)
}

// AbortPromote undoes a promotion of sandbox name that stopped partway:
// every path it wrote gets back what the host had before (its owner and
// mode included), with the same checks as ResumePromote.
func (m *Manager) AbortPromote(ctx context.Context, name string) (*PromoteResult, error) {
	return m.endJournal(ctx, name, true)
}

func (m *Manager) endJournal(ctx context.Context, name string, abort bool) (*PromoteResult, error) {
	what := "resume"
	if abort {
		what = "abort"
	}
	j, err := m.readJournal(name)
	if err != nil {
		return nil, fmt.Errorf("%s the promotion of sandbox %q: %w", what, name, err)
	}
	if j == nil {
		return nil, fmt.Errorf("%s the promotion of sandbox %q: none stopped partway (no journal)", what, name)
	}
	done, err := m.claimPromotion(name, j.Dir)
	if err != nil {
		return nil, err
	}
	defer done()
	if j, err = m.readJournal(name); err != nil || j == nil {
		return nil, fmt.Errorf("%s the promotion of sandbox %q: it ended meanwhile (%v)", what, name, err)
	}
	res, err := resumeJournal(ctx, m.fs, j, abort)
	if err != nil {
		return res, fmt.Errorf("%s the promotion of sandbox %q: %w", what, name, err)
	}
	if abort {
		m.dropJournal(ctx, j)
		return res, nil
	}
	return res, m.finishPromote(ctx, j)
}

// resumeJournal drives the host directory of j to its merged state, or
// with abort back to its state before the promotion.
func resumeJournal(ctx context.Context, f *cowfs.FS, j *journal, abort bool) (*PromoteResult, error) {
	ours, err := f.Resolve(ctx, j.Ours)
	if err != nil {
		return nil, err
	}
	merged, err := f.Resolve(ctx, j.Merged)
	if err != nil {
		return nil, err
	}
	o := cowfs.PromoteOptions{Privileges: j.Privileges, Umask: j.Umask, Diff: cowfs.DiffOptions{GitInternals: true}}
	from, to := ours, merged
	if abort {
		// What goes back is the host's own: its owners, modes and bits.
		zero := uint32(0)
		from, to = merged, ours
		o.Privileges, o.Umask = cowfs.HostPrivileges{SetID: true, Devices: true, Owners: true}, &zero
	}
	cres, err := f.PromoteResume(ctx, from, to, j.Dir, o, strconv.Itoa(j.PID))
	return &PromoteResult{PromoteResult: cres, Dir: j.Dir}, err
}
