// Package sandbox is tine's sandbox layer: a sandbox is a writable view of
// the environment (a cowfs branch for the project directory plus a
// private layer over the rest of the host OS), an isolated set of
// processes whose pid 1 is the guest agent, and metadata persisted under
// a state root. A Manager creates, forks, snapshots, rolls back and
// removes sandboxes; a Runtime (package sandbox/ns: namespaces) runs them.
package sandbox

import (
	"context"
	"errors"
	"strings"
	"time"
)

// Errors callers may test for with errors.Is.
var (
	// ErrNotFound reports an unknown sandbox or snapshot.
	ErrNotFound = errors.New("not found")
	// ErrExists reports a sandbox name already taken.
	ErrExists = errors.New("already exists")
	// ErrNotRunning reports a sandbox whose processes are not running.
	ErrNotRunning = errors.New("not running")
	// ErrBadName reports a name a new sandbox cannot have.
	ErrBadName = errors.New("bad name")
	// ErrDamaged reports a sandbox whose metadata cannot be read.
	ErrDamaged = errors.New("metadata cannot be read")
)

// State says whether a sandbox's processes run.
type State string

// The states of a sandbox.
const (
	Running State = "running"
	Stopped State = "stopped" // its files are kept; Start runs it again
	// Damaged is a sandbox whose metadata cannot be read (List's entry
	// has its name and Problem only): it cannot run, its files are kept,
	// and Remove removes it.
	Damaged State = "damaged"
)

// GuestSize is the size of a sandbox's virtual machine (vm runtime):
// its RAM and vCPUs. It is fixed at create and kept by forks.
type GuestSize struct {
	MemoryBytes int64 `json:"memory_bytes"`
	CPUs        int   `json:"cpus"`
}

// GuestSizer is a Runtime whose sandboxes are machines of a size: it
// fills in its defaults and refuses, with the reason, a size it cannot
// give. Other runtimes refuse a guest size.
type GuestSizer interface {
	GuestSize(want *GuestSize) (GuestSize, error)
}

// Limits bound what a sandbox may use. Zero means no limit.
type Limits struct {
	// Pids is the most processes and threads at once.
	Pids int64 `json:"pids,omitempty"`
	// ProjectBytes is the most bytes written into the project branch.
	ProjectBytes int64 `json:"project_bytes,omitempty"`
	// The rest is documented in limits.go.
	LimitsExt
}

// Info is a sandbox's persisted metadata.
type Info struct {
	Name    string `json:"name"`
	Runtime string `json:"runtime"`
	State   State  `json:"state"`
	// StopReason says why it last stopped, while it is Stopped: asked
	// to, the daemon shut down, or its pid 1 ended by itself (out of
	// memory, say). Empty when not known.
	StopReason string `json:"stop_reason,omitempty"`
	// Problem says, of a Damaged sandbox, why its metadata cannot be read.
	Problem string `json:"problem,omitempty"`
	// ProjectPath is the project directory's path inside the sandbox: the
	// host directory it was created from, at the same path.
	ProjectPath string `json:"project_path"`
	// Branch is the cowfs branch holding the project.
	Branch string `json:"branch"`
	// Origin is the cowfs snapshot the project started from; Diff compares
	// against it.
	Origin string `json:"origin"`
	// From is the host directory or sandbox snapshot it was created from.
	From string `json:"from"`
	// HostBase is the cowfs snapshot of the host directory ProjectPath as
	// last imported or promoted into; Promote and staleness compare the
	// host against it. Empty when not known (made from a snapshot that
	// did not carry it).
	HostBase string `json:"host_base,omitempty"`
	// GitBase is the git commit the host directory's HEAD named when the
	// sandbox (or the one it was forked from) was created, with the cowfs
	// snapshot of the directory taken then; empty when the directory was
	// not the top of a git work tree with a commit. Promotion to a git
	// branch builds on it.
	GitBase GitBase `json:"git_base,omitzero"`
	// ForkedFrom names the sandbox it was forked from, if any.
	ForkedFrom string    `json:"forked_from,omitempty"`
	Created    time.Time `json:"created"`
	Limits     Limits    `json:"limits"`
	// Guest is the size of a vm sandbox's machine; nil for other runtimes.
	Guest *GuestSize `json:"guest,omitempty"`
	// Env is the environment of commands that give none.
	Env []string `json:"env,omitempty"`
	// Services are shell commands started at every start of the sandbox
	// (create, fork, rollback, restart), their output kept as its logs.
	Services []string `json:"services,omitempty"`
	// MessageTo says which sandboxes it may message (see
	// ParseMessagePolicy); empty means family.
	MessageTo string `json:"message_to,omitempty"`
	// Image, when set, is the OS image the sandbox runs over in place of
	// the host's root.
	Image *Image `json:"image,omitempty"`
}

// Image is an unpacked OCI image whose root file system is a sandbox's
// OS lower layer in place of the host's / (see package oci). Forks,
// snapshots and restarts keep it.
type Image struct {
	// Ref is the name the image was asked for by.
	Ref string `json:"ref"`
	// Digest is its manifest digest, which identifies it.
	Digest string `json:"digest"`
	// Rootfs is the host directory of its unpacked root file system.
	Rootfs string `json:"rootfs"`
	// User is the image's USER as given, UID and GID what it resolved to
	// in the image's /etc/passwd and /etc/group; commands that name no
	// user run as it.
	User string  `json:"user,omitempty"`
	UID  *uint32 `json:"uid,omitempty"`
	GID  *uint32 `json:"gid,omitempty"`
	// Workdir is the working directory of commands that give none (the
	// default: the project directory).
	Workdir string `json:"workdir,omitempty"`
}

// SnapshotInfo is a sandbox snapshot's persisted metadata: the project at
// one instant (a cowfs snapshot) and a copy of the runtime's state taken
// at the same instant, with the sandbox frozen.
type SnapshotInfo struct {
	ID          string     `json:"id"`
	Name        string     `json:"name,omitempty"` // label given at snapshot time
	Sandbox     string     `json:"sandbox"`
	Runtime     string     `json:"runtime"`
	ProjectPath string     `json:"project_path"`
	FS          string     `json:"fs"` // cowfs snapshot id
	Created     time.Time  `json:"created"`
	Limits      Limits     `json:"limits"`
	Guest       *GuestSize `json:"guest,omitempty"`
	Env         []string   `json:"env,omitempty"`
	Services    []string   `json:"services,omitempty"`
	// HostBase is the sandbox's HostBase when the snapshot was taken.
	HostBase string `json:"host_base,omitempty"`
	// GitBase is the sandbox's GitBase, carried to what is made from the
	// snapshot.
	GitBase GitBase `json:"git_base,omitzero"`
	// Image is the sandbox's image, carried to what is made from the
	// snapshot.
	Image *Image `json:"image,omitempty"`
}

// Spec is what a Runtime needs to start a sandbox.
type Spec struct {
	// ID is unique on the host among running sandboxes (names cgroups).
	ID string
	// Hostname is the sandbox's host name.
	Hostname string
	// Dir is the runtime's own state directory for the sandbox; it lives as
	// long as the sandbox and is what CopyState copies.
	Dir string
	// ProjectPath is where the project appears inside the sandbox.
	ProjectPath string
	// ProjectSource is the host directory serving the project (the mounted
	// cowfs branch).
	ProjectSource string
	// Hide lists host paths the sandbox must not see (state roots).
	Hide   []string
	Limits Limits
	// Guest is a vm sandbox's machine size (nil: the runtime's default).
	Guest *GuestSize
	// Seed, when given, is the runtime state directory (Dir) of a
	// snapshot that the sandbox's state starts as a copy of; Dir must not
	// exist yet then.
	Seed string
	// Image, when given, is an image's root file system that is the
	// sandbox's OS lower layer in place of the host's /.
	Image string
	// APISocket, when given, is the host path of a listening Unix socket
	// that the runtime binds, read-only, at /run/tine/api.sock inside
	// the sandbox: the sandbox's own API (see api/inside.go).
	APISocket string
}

// Instance is one running sandbox's processes.
type Instance interface {
	// AgentSocket is the host path of the agent's Unix socket.
	AgentSocket() string
	// Freeze stops every process of the sandbox; Thaw resumes them.
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
	// Stop kills every process of the sandbox and releases what Start took
	// on the host (cgroups, mounts). Dir stays.
	Stop(ctx context.Context) error
	// Done is closed when the sandbox's pid 1 has ended.
	Done() <-chan struct{}
}

// Runtime runs sandboxes: ns (namespaces) now, a vm runtime later.
type Runtime interface {
	// Name names the runtime in metadata ("ns").
	Name() string
	// Start runs a sandbox whose agent answers a connection to
	// AgentSocket made once Start returns. A Dir that does not exist yet
	// is made (from Seed when given).
	Start(ctx context.Context, spec Spec) (Instance, error)
	// CopyState copies a sandbox's runtime state (Spec.Dir) from one
	// directory to another that does not exist yet, atomically and
	// durably: after a crash, to is missing or whole (and what is left
	// beside it has a name starting with ".tmp-"). The sandbox owning from
	// is stopped or frozen.
	CopyState(ctx context.Context, from, to string) error
}

// StateCapturer is a Runtime whose CopyState of a running sandbox splits
// in three, so that the sandbox stays frozen only while its state is
// read: PrepareState, with the sandbox running, may copy what it can
// ahead (what changes after is read again); CaptureState copies from
// (the sandbox frozen) and returns finish, called once the sandbox is
// thawed, which makes the copy durable and gives it the name to.
// CaptureState and finish together are CopyState; finish is called once,
// and removes the copy if it fails.
type StateCapturer interface {
	PrepareState(ctx context.Context, from, to string) error
	CaptureState(ctx context.Context, from, to string) (finish func() error, err error)
}

// ForkOptions says how many forks to make and what to call them.
type ForkOptions struct {
	// N is the number of forks (at least 1).
	N int
	// Names, when given, names the forks (len(Names) == N); the default
	// is PARENT-1 .. PARENT-N.
	Names []string
}

// SnapshotOptions labels a snapshot.
type SnapshotOptions struct {
	// Name, when given, is a label unique among the sandbox's snapshots
	// that Rollback and Diff accept in place of the id.
	Name string
}

// Staleness says how far the host directory a sandbox was created from
// has moved on since: files changed, added or removed there since the
// import, found by comparing metadata (no file is read).
type Staleness struct {
	Changed int `json:"changed"`
	Added   int `json:"added"`
	Removed int `json:"removed"`
	// Partial says the walk stopped at its bound (entries or time), or
	// met paths too long to name (deeper than PATH_MAX), and the counts
	// cover only what it saw.
	Partial bool `json:"partial,omitempty"`
	// Examples names up to 10 of the paths counted.
	Examples []string `json:"examples,omitempty"`
	// Unknown says why staleness could not be told (origin not a host
	// directory, or gone), when it could not.
	Unknown string `json:"unknown,omitempty"`
	// Git is how far the repository's HEAD moved since the sandbox's git
	// base, from git (nil without a git base).
	Git *GitStaleness `json:"git,omitempty"`
}

// Status is a sandbox's metadata with what is live about it now.
type Status struct {
	Info
	// Processes is the number of processes running in it (0 when stopped).
	Processes int `json:"processes"`
	// Ports is the number of listening sockets in it.
	Ports int `json:"ports"`
	// ProjectBytes is the bytes written to its project branch.
	ProjectBytes int64     `json:"project_bytes"`
	Stale        Staleness `json:"stale"`
	// StatusError says, in a list, why what is live about it could not be
	// told (its agent did not answer in time, say): the counts are 0.
	StatusError string `json:"status_error,omitempty"`
}

// MergeEnv returns base (KEY=value entries) with each key that over sets
// taking over's value, over's new keys appended in order.
func MergeEnv(base, over []string) []string {
	if len(base) == 0 {
		return over
	}
	idx := map[string]int{}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range append(append([]string(nil), base...), over...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}
