// Package api is tine's HTTP/JSON API: the typed requests and responses
// that the daemon (tine serve) answers on a Unix socket in the state root,
// and the server that answers them over a sandbox.Manager. Package
// api/client is its Go client. docs/api/openapi.json describes it.
package api

import (
	"time"

	"tine/guestagent/proto"
	"tine/sandbox"
)

// Version is the API's version: the first element of every path (/v1/...).
const Version = "v1"

// SocketName is the daemon's socket file in the state root.
const SocketName = "tine.sock"

// Error is the body of every response with a status of 400 or more. It is
// also an error: a ServerOptions hook may return one to choose the code.
type Error struct {
	// Code is a stable machine-readable word: bad_request (400),
	// not_found (404), exists, not_running, conflict (409), too_large
	// (413), denied (403), internal (500), not_implemented (501), and for
	// an exec whose command did not start command_not_found,
	// command_not_executable or bad_dir (422).
	Code string `json:"code"`
	// Message names the thing and says what to do.
	Message string `json:"message"`
	// ExitCode is, for an exec whose command did not start, the exit
	// status a shell gives: 127 (command_not_found) or 126.
	ExitCode int `json:"exit_code,omitempty"`
}

// Codes of an exec whose command did not start (HTTP 422), as a shell
// tells them apart; Error.ExitCode carries the shell's exit status.
const (
	// CodeCommandNotFound: not in PATH, no such path, or its interpreter
	// is missing (exit status 127).
	CodeCommandNotFound = "command_not_found"
	// CodeCommandNotExecutable: found but not executable (126).
	CodeCommandNotExecutable = "command_not_executable"
	// CodeBadDir: the working directory does not exist or is not a
	// directory (126).
	CodeBadDir = "bad_dir"
)

func (e *Error) Error() string { return e.Message }

// CreateRequest is the body of POST /v1/sandboxes.
type CreateRequest struct {
	Name string `json:"name,omitempty"` // default: a generated name
	// From is a host directory (absolute) or a sandbox snapshot id or
	// SANDBOX:LABEL.
	From     string         `json:"from"`
	Services []string       `json:"services,omitempty"`
	Env      []string       `json:"env,omitempty"`
	Limits   sandbox.Limits `json:"limits,omitempty"`
	// Network is the sandbox's network policy (default: mode none);
	// Secrets bind stored secrets to destinations; AutoExpose forwards a
	// host port to every new listener (network.go).
	Network    *NetworkRequest         `json:"network,omitempty"`
	Secrets    []sandbox.SecretBinding `json:"secrets,omitempty"`
	AutoExpose bool                    `json:"auto_expose,omitempty"`
	// Runtime names the sandbox's runtime, ns or vm (default: ns; from a
	// snapshot: the snapshot's).
	Runtime string `json:"runtime,omitempty"`
	// MessageTo is the sandboxes it may message: family (default: its
	// parent, siblings and forks), none, or family and name globs
	// ("family,worker-*"); a fork takes its parent's (messages.go).
	MessageTo string `json:"message_to,omitempty"`
	// Guest is a vm sandbox's machine size: RAM and vCPUs (default: the
	// daemon's --vm-memory and --vm-cpus; from a snapshot: the
	// snapshot's). Other runtimes refuse it.
	Guest *sandbox.GuestSize `json:"guest,omitempty"`
	// Image names an image in the daemon's store (tine image ls) whose
	// root file system is the sandbox's OS layer in place of the host's;
	// ImageWorkdir is the working directory of commands that give none
	// (default: the project directory).
	Image        string `json:"image,omitempty"`
	ImageWorkdir string `json:"image_workdir,omitempty"`
}

// Sandbox is a sandbox as the API reports it.
type Sandbox = sandbox.Status

// ForkRequest is the body of POST /v1/sandboxes/{name}/fork.
type ForkRequest struct {
	N     int      `json:"n"`
	Names []string `json:"names,omitempty"`
	// GitBranches is a branch name template ("try-{i}", "{name}"): each
	// fork records its branch, and a promotion of it to git that names no
	// branch goes there.
	GitBranches string `json:"git_branches,omitempty"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{name}/snapshots.
type SnapshotRequest struct {
	Name string `json:"name,omitempty"`
}

// RollbackRequest is the body of POST /v1/sandboxes/{name}/rollback.
type RollbackRequest struct {
	Snapshot string `json:"snapshot"` // id or label
}

// Change is one entry of GET /v1/sandboxes/{name}/diff.
type Change struct {
	Path string `json:"path"`
	// PathB64 holds the path's bytes in base64 when they are not UTF-8.
	PathB64 string `json:"path_b64,omitempty"`
	// Kind is added, deleted, modified, type-changed or mode-changed.
	Kind string `json:"kind"`
	// Type (file, dir, symlink, fifo, char, block or socket), Size and
	// Mode (07777 bits) are the new entry's, or for a deletion the old
	// one's.
	Type string `json:"type,omitempty"`
	Size int64  `json:"size,omitempty"`
	Mode uint32 `json:"mode,omitempty"`
	// OldType is the old entry's type when Kind is type-changed.
	OldType string `json:"old_type,omitempty"`
}

// ExecRequest starts a command: the body of POST /v1/sandboxes/{name}/exec
// (output streamed back as ExecEvent lines), or the first message of the
// WebSocket at GET /v1/sandboxes/{name}/exec/ws (interactive: stdin,
// resize and signals go the other way as ExecInput).
type ExecRequest struct {
	proto.ExecRequest
	// Timeout, when positive, kills the command after this long.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// ExecEvent is one message of an exec's output stream: exactly one field
// is set. Data is raw bytes (base64 in JSON).
type ExecEvent struct {
	Started *proto.Started `json:"started,omitempty"`
	Stdout  []byte         `json:"stdout,omitempty"`
	Stderr  []byte         `json:"stderr,omitempty"`
	Exit    *proto.Exit    `json:"exit,omitempty"`
	Error   *Error         `json:"error,omitempty"`
}

// ExecInput is one message from the client of an interactive exec.
type ExecInput struct {
	Stdin      []byte        `json:"stdin,omitempty"`
	CloseStdin bool          `json:"close_stdin,omitempty"`
	Resize     *proto.Resize `json:"resize,omitempty"`
	Signal     *proto.Signal `json:"signal,omitempty"`
}

// Info is the body of GET /v1/info: what this host can run.
type Info struct {
	Version  string        `json:"version"`
	Root     string        `json:"root"`
	Runtimes []RuntimeInfo `json:"runtimes"`
	// FUSE is how project mounts reach their server: "io_uring", or
	// "/dev/fuse" with the reason (docs/cowfs.md).
	FUSE string `json:"fuse,omitempty"`
}

// RuntimeInfo says whether a runtime and mode can run here, and why not.
type RuntimeInfo struct {
	Name      string `json:"name"` // ns, vm
	Mode      string `json:"mode"` // root, rootless
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
}

// FSRequest runs one "tine fs" command in the daemon, which owns the
// store and the mounts: the body of POST /v1/fs/{command}.
type FSRequest struct {
	Args []string          `json:"args"`           // positional arguments, host paths absolute
	Opts map[string]string `json:"opts,omitempty"` // flag name → value, as on the command line
	JSON bool              `json:"json,omitempty"`
}

// FSResponse is what an fs command printed.
type FSResponse struct {
	Output string `json:"output"`
}
