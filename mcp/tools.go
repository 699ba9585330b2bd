package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"tine/api"
	"tine/api/client"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// maxOutputBytes is the most bytes of stdout (and of stderr) an exec
// result carries; the progress notifications carry all of it.
const maxOutputBytes = 256 << 10

// tools holds one session's tool handlers.
type tools struct {
	c  *client.Client
	sc *scope
}

// Sandbox is a sandbox as the tools report it.
type Sandbox struct {
	Name        string `json:"name"`
	State       string `json:"state" jsonschema:"running or stopped"`
	From        string `json:"from" jsonschema:"the host directory or snapshot it was created from"`
	ProjectPath string `json:"project_path" jsonschema:"where the project is inside the sandbox"`
	ForkedFrom  string `json:"forked_from,omitempty" jsonschema:"the sandbox it was forked from"`
	Processes   int    `json:"processes"`
	Ports       int    `json:"ports"`
	// ProjectBytes is the bytes written to its project.
	ProjectBytes int64  `json:"project_bytes"`
	Image        string `json:"image,omitempty" jsonschema:"the OS image it runs over (name and digest), if not the host's"`
}

func summary(s *api.Sandbox) Sandbox {
	out := Sandbox{Name: s.Name, State: string(s.State), From: s.From, ProjectPath: s.ProjectPath,
		ForkedFrom: s.ForkedFrom, Processes: s.Processes, Ports: s.Ports, ProjectBytes: s.ProjectBytes}
	if s.Image != nil {
		out.Image = s.Image.Ref + "@" + s.Image.Digest
	}
	return out
}

// Limits are a sandbox's resource limits.
type Limits struct {
	Pids         int64   `json:"pids,omitempty" jsonschema:"the most processes and threads at once"`
	ProjectBytes int64   `json:"project_bytes,omitempty" jsonschema:"the most bytes written into the project"`
	MemoryBytes  int64   `json:"memory_bytes,omitempty" jsonschema:"the most memory, tmpfs files included"`
	CPUs         float64 `json:"cpus,omitempty" jsonschema:"CPU time per second, in CPUs"`
}

// NetworkIn is a new sandbox's network policy.
type NetworkIn struct {
	Mode  string   `json:"mode,omitempty" jsonschema:"none (the default), allow (only the allow-list) or open"`
	Allow []string `json:"allow,omitempty" jsonschema:"NAME, *.NAME, IP or CIDR, each with an optional :PORT or :LO-HI"`
}

// CreateIn are the create tool's arguments.
type CreateIn struct {
	From     string     `json:"from" jsonschema:"an absolute host directory (imported; appears at the same path inside), or a snapshot id, or SANDBOX:LABEL"`
	Name     string     `json:"name,omitempty" jsonschema:"1-63 of [A-Za-z0-9._-]; default: a generated name"`
	Env      []string   `json:"env,omitempty" jsonschema:"the environment of commands that give none, as KEY=VALUE pairs"`
	Services []string   `json:"services,omitempty" jsonschema:"shell commands started now and at every start, fork and rollback"`
	Limits   *Limits    `json:"limits,omitempty"`
	Network  *NetworkIn `json:"network,omitempty" jsonschema:"the network policy (default: no network)"`
	// MessageTo is its message policy (messages.go).
	MessageTo string `json:"message_to,omitempty" jsonschema:"which sandboxes it may message from inside: family (the default: its parent, siblings and forks), none, or family,GLOB[,GLOB]"`
	Image     string `json:"image,omitempty" jsonschema:"an OCI image in the daemon's store (tine image pull or import adds it) whose files replace the host's OS; only with a host directory in from"`
}

// SandboxOut is the result of create and of status.
type SandboxOut struct {
	Sandbox Sandbox `json:"sandbox"`
}

// NameIn names one sandbox.
type NameIn struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
}

// ListOut lists sandboxes.
type ListOut struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// ExecIn are the exec tool's arguments.
type ExecIn struct {
	Sandbox        string   `json:"sandbox" jsonschema:"the sandbox's name"`
	Command        string   `json:"command,omitempty" jsonschema:"a shell command line, run with sh -c; give this or argv"`
	Argv           []string `json:"argv,omitempty" jsonschema:"the program and its arguments; give this or command"`
	Dir            string   `json:"dir,omitempty" jsonschema:"working directory inside the sandbox (default: the project's path)"`
	Env            []string `json:"env,omitempty" jsonschema:"the environment, as KEY=VALUE pairs (default: the sandbox's)"`
	TimeoutSeconds float64  `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds"`
}

// ExecOut is how a command ended and what it printed.
type ExecOut struct {
	ExitCode int  `json:"exit_code" jsonschema:"the exit status, or -1 when a signal killed it"`
	Signal   int  `json:"signal,omitempty"`
	TimedOut bool `json:"timed_out,omitempty"`
	// KilledBy and KilledReason say what outside the command killed it.
	KilledBy     string `json:"killed_by,omitempty" jsonschema:"what outside the command killed it: oom (the sandbox's memory limit), stopped, removed or lifetime (the sandbox ended under it); absent otherwise"`
	KilledReason string `json:"killed_reason,omitempty" jsonschema:"killed_by in words, such as: out of memory (memory limit 64 MiB)"`
	Stdout       string `json:"stdout"`
	Stderr       string `json:"stderr"`
	// Truncated says stdout or stderr was cut to its last bytes.
	Truncated bool `json:"truncated,omitempty" jsonschema:"stdout or stderr exceeded 256 KiB and holds only its first 256 KiB"`
}

// ForkIn are the fork tool's arguments.
type ForkIn struct {
	Sandbox string   `json:"sandbox" jsonschema:"the sandbox to fork"`
	N       int      `json:"n,omitempty" jsonschema:"how many forks (default 1, or the number of names)"`
	Names   []string `json:"names,omitempty" jsonschema:"the forks' names (default: generated)"`
}

// SnapshotIn are the snapshot tool's arguments.
type SnapshotIn struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	Label   string `json:"label,omitempty" jsonschema:"a name for the snapshot, usable in rollback"`
}

// SnapshotOut is a snapshot taken.
type SnapshotOut struct {
	ID      string    `json:"id"`
	Label   string    `json:"label,omitempty"`
	Sandbox string    `json:"sandbox"`
	Created time.Time `json:"created"`
}

// RollbackIn are the rollback tool's arguments.
type RollbackIn struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's name"`
	Snapshot string `json:"snapshot" jsonschema:"a snapshot id or label of this sandbox"`
}

// DoneOut is the result of a tool that only acts.
type DoneOut struct {
	Done    bool   `json:"done"`
	Message string `json:"message"`
}

// DiffIn are the diff tool's arguments.
type DiffIn struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's name"`
	Snapshot string `json:"snapshot,omitempty" jsonschema:"compare against this snapshot instead of the origin"`
	Limit    int    `json:"limit,omitempty" jsonschema:"the most changes to list (default 1000, at most 10000); total says how many there are"`
}

// Change is one changed path.
type Change struct {
	Path string `json:"path"`
	Kind string `json:"kind" jsonschema:"added, deleted, modified, type-changed or mode-changed"`
	Type string `json:"type,omitempty" jsonschema:"file, dir, symlink, fifo, char, block or socket: the new entry's, or the deleted one's"`
	Size int64  `json:"size,omitempty"`
}

// DiffOut lists changes.
type DiffOut struct {
	Changes   []Change `json:"changes"`
	Total     int      `json:"total" jsonschema:"how many changes there are, listed or not"`
	Truncated bool     `json:"truncated,omitempty" jsonschema:"changes holds only the first limit of them"`
}

// PromoteIn are the promote tool's arguments.
type PromoteIn struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox whose changes go to the host directory it came from"`
	DryRun  bool   `json:"dry_run,omitempty" jsonschema:"check and report the plan; write nothing"`
}

// Problem is a path promote could not carry, and why.
type Problem struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// PromoteOut is what promote did or would do.
type PromoteOut struct {
	Changes   []Change  `json:"changes" jsonschema:"the first 1000 changes, in the diff's order"`
	Total     int       `json:"total" jsonschema:"how many changes there are, listed or not"`
	Truncated bool      `json:"truncated,omitempty" jsonschema:"changes holds only the first 1000"`
	Conflicts []Problem `json:"conflicts,omitempty" jsonschema:"paths changed on the host too; nothing was applied"`
	Refused   []Problem `json:"refused,omitempty" jsonschema:"entries that may not go to the host (device nodes, privilege)"`
	Applied   bool      `json:"applied"`
}

// Process is one process in a sandbox.
type Process struct {
	PID   int      `json:"pid"`
	PPID  int      `json:"ppid"`
	User  string   `json:"user,omitempty"`
	Argv  []string `json:"argv"`
	State string   `json:"state"`
	RSS   uint64   `json:"rss" jsonschema:"resident memory in bytes"`
}

// PsOut lists processes.
type PsOut struct {
	Processes []Process `json:"processes"`
}

// Port is a listening socket in a sandbox.
type Port struct {
	Proto   string `json:"proto"`
	Address string `json:"address"`
	Port    uint16 `json:"port"`
	PID     int    `json:"pid,omitempty"`
}

// PortsOut lists listening sockets.
type PortsOut struct {
	Ports []Port `json:"ports"`
}

// How many changes diff and promote list: a diff of a whole package
// install would otherwise fill an agent's context.
const (
	defaultChanges = 1000
	maxChanges     = 10000
)

// changes converts the first limit of cs, and says whether that left
// some out.
func changes(cs []api.Change, limit int) ([]Change, bool) {
	n := min(len(cs), limit)
	out := make([]Change, 0, n)
	for _, c := range cs[:n] {
		out = append(out, changeOf(c))
	}
	return out, n < len(cs)
}

// changeOf is the tool's form of an API change.
func changeOf(c api.Change) Change {
	return Change{Path: c.Path, Kind: c.Kind, Type: c.Type, Size: c.Size}
}

// readOnly and destructive annotate tools for clients that ask before
// calling tools with effects.
var (
	readOnly = &sdk.ToolAnnotations{ReadOnlyHint: true}
	yes      = true
	no       = false
)

func (t *tools) register(s *sdk.Server) {
	sdk.AddTool(s, &sdk.Tool{Name: "create", Description: "Create and start a sandbox from a host directory or a snapshot.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no}}, t.create)
	sdk.AddTool(s, &sdk.Tool{Name: "list", Description: "List this session's sandboxes (those it created and their forks).", Annotations: readOnly}, t.list)
	sdk.AddTool(s, &sdk.Tool{Name: "status", Description: "One sandbox's state and usage.", Annotations: readOnly}, t.status)
	sdk.AddTool(s, &sdk.Tool{Name: "exec", Description: "Run a command in a sandbox and wait for it. Output is streamed as progress notifications when the call has a progress token, and returned (up to 256 KiB of each stream) at the end."}, t.exec)
	sdk.AddTool(s, &sdk.Tool{Name: "fork", Description: "Fork a sandbox N ways: new running sandboxes from a snapshot taken now.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no}}, t.fork)
	sdk.AddTool(s, &sdk.Tool{Name: "snapshot", Description: "Fix a sandbox's files at this instant; roll back to it later.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no}}, t.snapshot)
	sdk.AddTool(s, &sdk.Tool{Name: "rollback", Description: "Return a sandbox to one of its snapshots; its processes restart.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}}, t.rollback)
	sdk.AddTool(s, &sdk.Tool{Name: "diff", Description: "List the sandbox's project changes since its origin or a snapshot.", Annotations: readOnly}, t.diff)
	sdk.AddTool(s, &sdk.Tool{Name: "promote", Description: "Apply a sandbox's changes to the host directory it came from, after a conflict check. Call with dry_run first to see the plan.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}}, t.promote)
	sdk.AddTool(s, &sdk.Tool{Name: "ps", Description: "List a sandbox's processes.", Annotations: readOnly}, t.ps)
	sdk.AddTool(s, &sdk.Tool{Name: "ports", Description: "List a sandbox's listening sockets.", Annotations: readOnly}, t.ports)
	sdk.AddTool(s, &sdk.Tool{Name: "rm", Description: "Stop and delete a sandbox and its snapshots.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}}, t.rm)
	t.registerMessages(s) // messages.go
	t.registerFiles(s)    // files.go
}

func (t *tools) create(ctx context.Context, _ *sdk.CallToolRequest, in CreateIn) (*sdk.CallToolResult, SandboxOut, error) {
	req := api.CreateRequest{Name: in.Name, From: in.From, Env: in.Env, Services: in.Services, MessageTo: in.MessageTo, Image: in.Image}
	if in.Limits != nil {
		req.Limits = sandbox.Limits{Pids: in.Limits.Pids, ProjectBytes: in.Limits.ProjectBytes}
		req.Limits.MemoryBytes, req.Limits.CPUs = in.Limits.MemoryBytes, in.Limits.CPUs
	}
	if in.Network != nil {
		mode := in.Network.Mode
		if mode == "" && len(in.Network.Allow) > 0 {
			mode = "allow"
		}
		req.Network = &api.NetworkRequest{Mode: mode, Allow: in.Network.Allow}
	}
	sb, err := t.c.Create(ctx, req)
	if err != nil {
		return nil, SandboxOut{}, fmt.Errorf("create: %w", err)
	}
	t.sc.add(sb.Name)
	return nil, SandboxOut{Sandbox: summary(sb)}, nil
}

func (t *tools) list(ctx context.Context, _ *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, ListOut, error) {
	all, err := t.c.List(ctx)
	if err != nil {
		return nil, ListOut{}, err
	}
	out := ListOut{Sandboxes: []Sandbox{}}
	for _, sb := range t.sc.visible(all) {
		out.Sandboxes = append(out.Sandboxes, summary(&sb))
	}
	return nil, out, nil
}

func (t *tools) status(ctx context.Context, _ *sdk.CallToolRequest, in NameIn) (*sdk.CallToolResult, SandboxOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, SandboxOut{}, err
	}
	sb, err := t.c.Get(ctx, in.Sandbox)
	if err != nil {
		return nil, SandboxOut{}, err
	}
	return nil, SandboxOut{Sandbox: summary(sb)}, nil
}

// progressWriter keeps the first maxOutputBytes of a stream and sends each
// write as a progress notification.
type progressWriter struct {
	mu     *sync.Mutex
	stream string
	buf    []byte
	cut    bool
	notify func(stream string, p []byte)
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	room := maxOutputBytes - len(w.buf)
	if len(p) > room {
		w.cut = true
	}
	w.buf = append(w.buf, p[:min(room, len(p))]...)
	if w.notify != nil {
		w.notify(w.stream, p)
	}
	return len(p), nil
}

func (t *tools) exec(ctx context.Context, req *sdk.CallToolRequest, in ExecIn) (*sdk.CallToolResult, ExecOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, ExecOut{}, err
	}
	argv := in.Argv
	switch {
	case in.Command != "" && len(argv) > 0:
		return nil, ExecOut{}, fmt.Errorf("exec: give command or argv, not both")
	case in.Command != "":
		argv = []string{"sh", "-c", in.Command}
	case len(argv) == 0:
		return nil, ExecOut{}, fmt.Errorf("exec: give command (a shell line) or argv (a program and its arguments)")
	}
	dir := in.Dir
	if dir == "" {
		sb, err := t.c.Get(ctx, in.Sandbox)
		if err != nil {
			return nil, ExecOut{}, err
		}
		dir = sb.ProjectPath
	}
	er := api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: argv, Env: in.Env, Dir: dir}}
	if in.TimeoutSeconds > 0 {
		er.Timeout = time.Duration(in.TimeoutSeconds * float64(time.Second))
	}
	var mu sync.Mutex
	var notify func(string, []byte)
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		var sent float64
		notify = func(stream string, p []byte) {
			sent += float64(len(p))
			// A client that went away only loses notifications; the
			// command's result still comes.
			_ = req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
				ProgressToken: tok, Progress: sent,
				Message: strings.ToValidUTF8(string(p), "\uFFFD"),
				Meta:    sdk.Meta{"stream": stream},
			})
		}
	}
	stdout := &progressWriter{mu: &mu, stream: "stdout", notify: notify}
	stderr := &progressWriter{mu: &mu, stream: "stderr", notify: notify}
	ex, err := t.c.Exec(ctx, in.Sandbox, er, client.ExecIO{Stdout: stdout, Stderr: stderr})
	if ce := (*client.Error)(nil); errors.As(err, &ce) && ce.ExitCode != 0 {
		// The command did not start: the exit status and message a shell
		// gives (127 not found, 126 not executable).
		return nil, ExecOut{ExitCode: ce.ExitCode, Stderr: strings.ToValidUTF8(ce.Message, "\uFFFD") + "\n"}, nil
	}
	if err != nil {
		return nil, ExecOut{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	return nil, ExecOut{
		ExitCode: ex.Code, Signal: ex.Signal, TimedOut: ex.TimedOut,
		KilledBy: ex.KilledBy, KilledReason: ex.KilledReason,
		Stdout:    strings.ToValidUTF8(string(stdout.buf), "\uFFFD"),
		Stderr:    strings.ToValidUTF8(string(stderr.buf), "\uFFFD"),
		Truncated: stdout.cut || stderr.cut,
	}, nil
}

func (t *tools) fork(ctx context.Context, _ *sdk.CallToolRequest, in ForkIn) (*sdk.CallToolResult, ListOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, ListOut{}, err
	}
	n := in.N
	if n == 0 {
		n = max(1, len(in.Names))
	}
	sbs, err := t.c.Fork(ctx, in.Sandbox, api.ForkRequest{N: n, Names: in.Names})
	if err != nil {
		return nil, ListOut{}, err
	}
	out := ListOut{Sandboxes: []Sandbox{}}
	for i := range sbs {
		t.sc.add(sbs[i].Name)
		out.Sandboxes = append(out.Sandboxes, summary(&sbs[i]))
	}
	return nil, out, nil
}

func (t *tools) snapshot(ctx context.Context, _ *sdk.CallToolRequest, in SnapshotIn) (*sdk.CallToolResult, SnapshotOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, SnapshotOut{}, err
	}
	s, err := t.c.Snapshot(ctx, in.Sandbox, api.SnapshotRequest{Name: in.Label})
	if err != nil {
		return nil, SnapshotOut{}, err
	}
	return nil, SnapshotOut{ID: s.ID, Label: s.Name, Sandbox: s.Sandbox, Created: s.Created}, nil
}

func (t *tools) rollback(ctx context.Context, _ *sdk.CallToolRequest, in RollbackIn) (*sdk.CallToolResult, DoneOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, DoneOut{}, err
	}
	if err := t.c.Rollback(ctx, in.Sandbox, api.RollbackRequest{Snapshot: in.Snapshot}); err != nil {
		return nil, DoneOut{}, err
	}
	return nil, DoneOut{Done: true, Message: fmt.Sprintf("sandbox %s is back at snapshot %s", in.Sandbox, in.Snapshot)}, nil
}

func (t *tools) diff(ctx context.Context, _ *sdk.CallToolRequest, in DiffIn) (*sdk.CallToolResult, DiffOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, DiffOut{}, err
	}
	limit := in.Limit
	if limit == 0 {
		limit = defaultChanges
	}
	if limit < 1 || limit > maxChanges {
		return nil, DiffOut{}, fmt.Errorf("limit %d: want 1 to %d changes", in.Limit, maxChanges)
	}
	// The first limit changes are kept and the rest only counted, so a
	// diff of any size costs this server limit changes of memory.
	out := DiffOut{Changes: []Change{}}
	err := t.c.DiffEach(ctx, in.Sandbox, in.Snapshot, func(c api.Change) error {
		if out.Total++; out.Total <= limit {
			out.Changes = append(out.Changes, changeOf(c))
		}
		return nil
	})
	if err != nil {
		return nil, DiffOut{}, err
	}
	out.Truncated = out.Total > limit
	return nil, out, nil
}

func (t *tools) promote(ctx context.Context, _ *sdk.CallToolRequest, in PromoteIn) (*sdk.CallToolResult, PromoteOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, PromoteOut{}, err
	}
	r, err := t.c.Promote(ctx, in.Sandbox, api.PromoteRequest{DryRun: in.DryRun})
	if err != nil {
		return nil, PromoteOut{}, err
	}
	out := PromoteOut{Total: len(r.Changes), Applied: r.Applied}
	out.Changes, out.Truncated = changes(r.Changes, defaultChanges)
	for _, c := range r.Conflicts {
		out.Conflicts = append(out.Conflicts, Problem{Path: c.Path, Reason: c.Reason})
	}
	for _, c := range r.Refused {
		out.Refused = append(out.Refused, Problem{Path: c.Path, Reason: c.Reason})
	}
	return nil, out, nil
}

func (t *tools) ps(ctx context.Context, _ *sdk.CallToolRequest, in NameIn) (*sdk.CallToolResult, PsOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, PsOut{}, err
	}
	ps, err := t.c.Ps(ctx, in.Sandbox)
	if err != nil {
		return nil, PsOut{}, err
	}
	out := PsOut{Processes: []Process{}}
	for _, p := range ps {
		out.Processes = append(out.Processes, Process{PID: p.PID, PPID: p.PPID, User: p.User, Argv: p.Argv, State: p.State, RSS: p.RSS})
	}
	return nil, out, nil
}

func (t *tools) ports(ctx context.Context, _ *sdk.CallToolRequest, in NameIn) (*sdk.CallToolResult, PortsOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, PortsOut{}, err
	}
	ps, err := t.c.Ports(ctx, in.Sandbox)
	if err != nil {
		return nil, PortsOut{}, err
	}
	out := PortsOut{Ports: []Port{}}
	for _, p := range ps {
		out.Ports = append(out.Ports, Port{Proto: p.Proto, Address: p.Address, Port: p.Port, PID: p.PID})
	}
	return nil, out, nil
}

func (t *tools) rm(ctx context.Context, _ *sdk.CallToolRequest, in NameIn) (*sdk.CallToolResult, DoneOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, DoneOut{}, err
	}
	// Its forks stay this session's once the link through it is gone.
	if all, err := t.c.List(ctx); err == nil {
		for _, sb := range t.sc.visible(all) {
			t.sc.add(sb.Name)
		}
	}
	if err := t.c.Remove(ctx, in.Sandbox); err != nil {
		return nil, DoneOut{}, err
	}
	t.sc.drop(in.Sandbox)
	return nil, DoneOut{Done: true, Message: fmt.Sprintf("sandbox %s removed", in.Sandbox)}, nil
}
