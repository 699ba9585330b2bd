package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"tine/sandbox"
)

// The API inside a sandbox: each sandbox reaches its own Unix socket at
// /run/tine/api.sock (bound there by the runtime, see sandbox.Spec's
// APISocket), served by Inside. Which sandbox asks is fixed by the socket
// the request came in on, never by anything the request says; through it
// a sandbox acts on itself and on its forks (at any depth) only. The
// name "self" stands for the asking sandbox in every path.

// InsideSocket is where a sandbox finds its own API.
const InsideSocket = "/run/tine/api.sock"

// InsideOptions is the policy of what sandboxes may ask for themselves.
type InsideOptions struct {
	// MaxLimits bounds what a sandbox may ask its limits to be raised to
	// (POST /v1/self/resources: memory, cpus, pids, project bytes); a
	// field left zero may not be raised at all. Requests within it and
	// past Grant wait for a person's approval.
	MaxLimits sandbox.Limits
	// Grant is what a sandbox gets at once when it asks, applied while
	// it runs (inside_resources.go); at most MaxLimits, field by field.
	Grant sandbox.Limits
	// MaxTree bounds how many sandboxes a sandbox's tree (itself and its
	// forks) may hold after a fork made from inside; default 64.
	MaxTree int
}

// Inside serves every sandbox its own API; it is the manager's
// sandbox.InsideAPI (Manager.SetInsideAPI). The daemon's Server shows
// and answers the approvals it records (ServerOptions.Inside).
type Inside struct {
	m *sandbox.Manager
	o InsideOptions

	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	served map[string]*insideListener
	appr   approvals
	reads  inboxReads // messages.go
}

// insideListener is one sandbox's socket and the server answering it.
type insideListener struct {
	path string
	srv  *http.Server
}

// NewInside returns the inside API of the sandboxes m manages.
func NewInside(m *sandbox.Manager, o InsideOptions) *Inside {
	if o.MaxTree <= 0 {
		o.MaxTree = 64
	}
	in := &Inside{m: m, o: o, served: map[string]*insideListener{}}
	in.ctx, in.cancel = context.WithCancel(context.Background())
	in.appr.changed = make(chan struct{})
	return in
}

// Listen serves sandbox name on a socket at path, unless it is served
// there already. Anyone who can reach the path may connect (mode 0666):
// only the sandbox can, as its state directory is the daemon's alone.
func (in *Inside) Listen(name, path string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.ctx.Err() != nil {
		return errors.New("the daemon is stopping")
	}
	if l, ok := in.served[name]; ok {
		if st, err := os.Lstat(l.path); l.path == path && err == nil && st.Mode().Type() == os.ModeSocket {
			return nil
		}
		l.srv.Close()
		delete(in.served, name)
	}
	os.Remove(path) // left by an earlier daemon
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return err
	}
	h := &insideHandler{in: in, self: name}
	srv := &http.Server{Handler: h.mux(), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10,
		BaseContext: func(net.Listener) context.Context { return in.ctx }}
	in.served[name] = &insideListener{path: path, srv: srv}
	go srv.Serve(ln)
	return nil
}

// ServeListener serves sandbox name's API on ln (its address on its
// gateway, bound to its veth: see sandbox.InsideHTTP) until ln is closed;
// its connections end with it.
func (in *Inside) ServeListener(name string, ln net.Listener) error {
	h := &insideHandler{in: in, self: name}
	srv := &http.Server{Handler: h.mux(), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10,
		BaseContext: func(net.Listener) context.Context { return in.ctx }}
	err := srv.Serve(ln)
	srv.Close()
	return err
}

// Forget stops serving sandbox name and drops its approvals.
func (in *Inside) Forget(name string) {
	in.mu.Lock()
	l, ok := in.served[name]
	delete(in.served, name)
	in.mu.Unlock()
	if ok {
		l.srv.Close()
		os.Remove(l.path)
	}
	in.appr.forget(name)
}

// Close stops serving every sandbox; requests waiting for an answer end.
func (in *Inside) Close() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.cancel()
	for n, l := range in.served {
		l.srv.Close()
		delete(in.served, n)
	}
	return nil
}

// insideHandler answers one sandbox's socket: self is who asks.
type insideHandler struct {
	in   *Inside
	self string
}

func (h *insideHandler) mux() http.Handler {
	mux := http.NewServeMux()
	sb := "/" + Version + "/sandboxes/{name}"
	for _, rt := range []route{
		{"GET", "/" + Version + "/sandboxes", h.list},
		{"GET", sb, h.get},
		{"DELETE", sb, h.remove},
		{"GET", sb + "/limits", h.limits},
		{"GET", sb + "/snapshots", h.snapshots},
		{"POST", sb + "/snapshots", h.snapshot},
		{"POST", sb + "/rollback", h.rollback},
		{"POST", sb + "/fork", h.fork},
		{"GET", "/" + Version + "/self", h.get},
		{"GET", "/" + Version + "/self/limits", h.limits},
		{"GET", "/" + Version + "/self/snapshots", h.snapshots},
		{"POST", "/" + Version + "/self/snapshots", h.snapshot},
		{"POST", "/" + Version + "/self/rollback", h.rollback},
		{"POST", "/" + Version + "/self/fork", h.fork},
		{"POST", "/" + Version + "/self/resources", h.resources},
		{"GET", "/" + Version + "/self/approvals", h.approvals},
		{"POST", "/" + Version + "/self/approvals", h.ask},
		{"GET", "/" + Version + "/self/approvals/{id}", h.approval},
		{"POST", "/" + Version + "/messages", h.send},
		{"GET", "/" + Version + "/messages", h.receive},
	} {
		mux.HandleFunc(rt.method+" "+rt.path, rt.h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &Error{Code: "not_found", Message: fmt.Sprintf("no route %s %s inside a sandbox (see docs/api.md, \"Inside a sandbox\")", r.Method, r.URL.Path)})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		mux.ServeHTTP(w, r)
	})
}

// target returns the sandbox the request's path names ("self" or absent:
// the asking sandbox) when it is the asking sandbox or one of its forks;
// any other name is answered as not found, whether it exists or not.
func (h *insideHandler) target(w http.ResponseWriter, r *http.Request) (string, bool) {
	name, err := insideTarget(h.self, r.PathValue("name"), h.in.m.InTree)
	if err != nil {
		writeError(w, err)
		return "", false
	}
	return name, true
}

// insideTarget resolves a path's sandbox name for the asking sandbox
// self; inTree says whether a name is root or one of its forks.
func insideTarget(self, name string, inTree func(root, name string) bool) (string, error) {
	if name == "" || name == "self" {
		return self, nil
	}
	if !validName(name) {
		return "", badRequest("sandbox name %q in the path: want 1-63 of [A-Za-z0-9._-], starting with a letter or digit, or \"self\"", name)
	}
	if name != self && !inTree(self, name) {
		return "", &Error{Code: "not_found", Message: fmt.Sprintf("sandbox %q: no such sandbox among %q and its forks; a sandbox acts only on itself and its forks", name, self)}
	}
	return name, nil
}

// forbidden answers 403: what a sandbox asked is beyond its policy.
func forbidden(w http.ResponseWriter, format string, a ...any) {
	writeJSON(w, http.StatusForbidden, &Error{Code: "forbidden", Message: fmt.Sprintf(format, a...)})
}

func (h *insideHandler) list(w http.ResponseWriter, r *http.Request) {
	infos, err := h.in.m.List()
	if err != nil {
		writeError(w, err)
		return
	}
	var tree []*sandbox.Info
	for _, info := range infos {
		if info.State != sandbox.Damaged && h.in.m.InTree(h.self, info.Name) {
			tree = append(tree, info)
		}
	}
	writeJSON(w, http.StatusOK, statuses(r.Context(), h.in.m, tree, true))
}

func (h *insideHandler) get(w http.ResponseWriter, r *http.Request) {
	name, ok := h.target(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), statusTimeout)
	defer cancel()
	st, err := h.in.m.Status(ctx, name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// InsideLimits answers GET /v1/self/limits inside a sandbox.
type InsideLimits struct {
	// Limits are the sandbox's own.
	Limits sandbox.Limits `json:"limits"`
	// Max is what the policy lets it ask for (POST /v1/self/resources).
	Max sandbox.Limits `json:"max"`
	// Grant is what it gets at once when it asks; past it a person decides.
	Grant sandbox.Limits `json:"grant"`
	// Processes and ProjectBytes are what it uses now.
	Processes    int   `json:"processes"`
	ProjectBytes int64 `json:"project_bytes"`
}

func (h *insideHandler) limits(w http.ResponseWriter, r *http.Request) {
	name, ok := h.target(w, r)
	if !ok {
		return
	}
	st, err := h.in.m.Status(r.Context(), name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, &InsideLimits{Limits: st.Limits, Max: h.in.o.MaxLimits, Grant: h.in.o.Grant, Processes: st.Processes, ProjectBytes: st.ProjectBytes})
}

func (h *insideHandler) remove(w http.ResponseWriter, r *http.Request) {
	name, ok := h.target(w, r)
	if !ok {
		return
	}
	if name == h.self {
		forbidden(w, "sandbox %q cannot remove itself from inside; a person removes it with tine rm", name)
		return
	}
	if err := h.in.m.Remove(context.WithoutCancel(r.Context()), name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *insideHandler) snapshots(w http.ResponseWriter, r *http.Request) {
	name, ok := h.target(w, r)
	if !ok {
		return
	}
	snaps, err := h.in.m.Snapshots(name)
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]sandbox.SnapshotInfo, len(snaps))
	for i, sn := range snaps {
		out[i] = *sn
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *insideHandler) snapshot(w http.ResponseWriter, r *http.Request) {
	name, ok := h.target(w, r)
	if !ok {
		return
	}
	var req SnapshotRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Name != "" && !validName(req.Name) {
		writeError(w, badRequest("snapshot name %q: want 1-63 of [A-Za-z0-9._-], starting with a letter or digit", req.Name))
		return
	}
	snap, err := h.in.m.Snapshot(context.WithoutCancel(r.Context()), name, sandbox.SnapshotOptions{Name: req.Name})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snap)
}

// rollback rolls a sandbox back to one of its own snapshots. Rolled back,
// the asking sandbox's processes start again, so for itself the answer
// (202) comes first, once the snapshot is known to be its own.
func (h *insideHandler) rollback(w http.ResponseWriter, r *http.Request) {
	name, ok := h.target(w, r)
	if !ok {
		return
	}
	var req RollbackRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Snapshot == "" {
		writeError(w, badRequest("rollback sandbox %q: field \"snapshot\" is empty; give a snapshot id or label of the sandbox", name))
		return
	}
	snaps, err := h.in.m.Snapshots(name)
	if err != nil {
		writeError(w, err)
		return
	}
	found := false
	for _, s := range snaps {
		found = found || s.ID == req.Snapshot || (s.Name != "" && s.Name == req.Snapshot)
	}
	if !found {
		writeError(w, &Error{Code: "not_found", Message: fmt.Sprintf("rollback sandbox %q: no snapshot %q of its own; list them with GET /v1/self/snapshots", name, req.Snapshot)})
		return
	}
	if name != h.self {
		if err := h.in.m.Rollback(context.WithoutCancel(r.Context()), name, req.Snapshot); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"rollback": req.Snapshot, "sandbox": name,
		"note": "this sandbox's processes end now and start again from the snapshot"})
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	// Give the caller a moment to read the answer: until it closes the
	// connection, for at most rollbackGrace.
	t := time.NewTimer(rollbackGrace)
	defer t.Stop()
	select {
	case <-r.Context().Done():
	case <-t.C:
	}
	go h.in.m.Rollback(context.Background(), name, req.Snapshot)
}

// rollbackGrace is how long a sandbox rolling itself back has to read
// the answer before its processes end.
const rollbackGrace = 2 * time.Second

func (h *insideHandler) fork(w http.ResponseWriter, r *http.Request) {
	name, ok := h.target(w, r)
	if !ok {
		return
	}
	var req ForkRequest
	if !decode(w, r, &req) {
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, err)
		return
	}
	infos, err := h.in.m.List()
	if err != nil {
		writeError(w, err)
		return
	}
	tree := 0
	for _, info := range infos {
		if h.in.m.InTree(h.self, info.Name) {
			tree++
		}
	}
	if tree+req.N > h.in.o.MaxTree {
		forbidden(w, "fork %q %d ways: the tree of %q would hold %d sandboxes, more than the policy's %d; remove some forks first", name, req.N, h.self, tree+req.N, h.in.o.MaxTree)
		return
	}
	forks, err := h.in.m.Fork(context.WithoutCancel(r.Context()), name, sandbox.ForkOptions{N: req.N, Names: req.Names})
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]Sandbox, len(forks))
	for i, f := range forks {
		out[i] = Sandbox{Info: *f}
	}
	writeJSON(w, http.StatusCreated, out)
}
