package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"tine/guestagent/client"
	"tine/oci"
	"tine/sandbox"
)

// ServerOptions holds what the daemon lends the server beyond the
// sandbox manager.
type ServerOptions struct {
	// Info answers GET /v1/info; nil answers with the version only.
	Info func(ctx context.Context) (*Info, error)
	// FS runs one "tine fs" command in-process and writes what it prints
	// to w; nil answers POST /v1/fs/{command} with 501 not_implemented.
	// An *Error it returns chooses the response's code.
	FS func(ctx context.Context, command string, req FSRequest, w io.Writer) error
	// Inside, when given, serves each sandbox its own API; the server
	// lists and answers the approvals sandboxes ask for through it.
	Inside *Inside
	// Images, when given, is the image store sandboxes may run over
	// (images.go); nil answers the image routes with 501.
	Images *oci.Store
}

// Server answers the API over a sandbox.Manager. It is an http.Handler;
// Serve runs it on a listener with the timeouts the API needs.
type Server struct {
	m      *sandbox.Manager
	o      ServerOptions
	mux    *http.ServeMux
	routes []route

	// ctx ends every stream (exec, logs, events) when the server closes,
	// WebSockets included, which http.Server does not track.
	ctx    context.Context
	cancel context.CancelFunc

	mu  sync.Mutex
	srv *http.Server
}

// route is one method and path pattern the server answers.
type route struct {
	method, path string
	h            http.HandlerFunc
}

// NewServer returns a server of the sandboxes m manages.
func NewServer(m *sandbox.Manager, o ServerOptions) *Server {
	s := &Server{m: m, o: o, mux: http.NewServeMux()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	sb := "/" + Version + "/sandboxes/{name}"
	s.routes = []route{
		{"GET", "/" + Version + "/info", s.info},
		{"GET", "/" + Version + "/sandboxes", s.list},
		{"POST", "/" + Version + "/sandboxes", s.create},
		{"GET", sb, s.get},
		{"DELETE", sb, s.remove},
		{"POST", sb + "/start", s.start},
		{"POST", sb + "/stop", s.stop},
		{"POST", sb + "/fork", s.fork},
		{"POST", sb + "/rollback", s.rollback},
		{"POST", sb + "/promote", s.promote},
		{"GET", sb + "/snapshots", s.snapshots},
		{"POST", sb + "/snapshots", s.snapshot},
		{"GET", sb + "/diff", s.diff},
		{"GET", sb + "/ps", s.ps},
		{"GET", sb + "/ports", s.ports},
		{"GET", sb + "/logs", s.logs},
		{"GET", sb + "/events", s.events},
		{"GET", sb + "/files", s.getFile},
		{"PUT", sb + "/files", s.putFile},
		{"GET", sb + "/archive", s.getArchive},
		{"PUT", sb + "/archive", s.putArchive},
		{"POST", sb + "/exec", s.exec},
		{"GET", sb + "/exec/ws", s.execWS},
		{"POST", "/" + Version + "/fs/{command}", s.fs},
		// Limits, freezer, audit and exec policy (limits.go, audit.go,
		// execpolicy.go); exec approvals join the list below.
		{"GET", sb + "/limits", s.getLimits},
		{"GET", "/" + Version + "/usage", s.usage},
		{"PUT", sb + "/limits", s.putLimits},
		{"POST", sb + "/freeze", s.freeze},
		{"POST", sb + "/thaw", s.thaw},
		{"GET", sb + "/audit", s.auditLog},
		{"GET", sb + "/audit/verify", s.auditVerify},
		{"GET", "/" + Version + "/audit", s.auditLog},
		{"GET", "/" + Version + "/audit/verify", s.auditVerify},
		{"GET", sb + "/policy/exec", s.getExecPolicy},
		{"PUT", sb + "/policy/exec", s.putExecPolicy},
		// Approvals asked for from inside sandboxes (approvals.go).
		{"GET", "/" + Version + "/approvals", s.approvalsList},
		{"POST", "/" + Version + "/approvals/{id}/approve", s.approve},
		{"POST", "/" + Version + "/approvals/{id}/deny", s.deny},
		// network policy, exposed ports and secrets (network.go)
		{"GET", sb + "/network", s.network},
		{"PUT", sb + "/network", s.setNetwork},
		{"GET", sb + "/exposures", s.exposures},
		{"POST", sb + "/exposures", s.expose},
		{"PUT", sb + "/exposures/auto", s.autoExpose},
		{"DELETE", sb + "/exposures/{port}", s.unexpose},
		{"GET", "/" + Version + "/secrets", s.secrets},
		{"PUT", "/" + Version + "/secrets/{secret}", s.setSecret},
		{"DELETE", "/" + Version + "/secrets/{secret}", s.removeSecret},
		// messages from the host and inboxes (messages.go)
		{"POST", sb + "/messages", s.sendMessage},
		{"GET", sb + "/messages", s.messages},
		// OCI images (images.go)
		{"GET", "/" + Version + "/images", s.imageList},
		{"POST", "/" + Version + "/images/pull", s.imagePull},
		{"POST", "/" + Version + "/images/import", s.imageImport},
		{"GET", "/" + Version + "/images/{ref...}", s.imageGet},
		{"DELETE", "/" + Version + "/images/{ref...}", s.imageRemove},
	}
	for _, rt := range s.routes {
		s.mux.HandleFunc(rt.method+" "+rt.path, rt.h)
	}
	s.mux.HandleFunc("/", s.noRoute)
	return s
}

// noRoute answers a request no route takes: 405 naming the methods the
// path has, or 404.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{"GET", "POST", "PUT", "DELETE"} {
		rr := r.Clone(r.Context())
		rr.Method = m
		if _, pat := s.mux.Handler(rr); pat != "/" && pat != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, &Error{Code: "bad_request",
			Message: fmt.Sprintf("%s %s: the path takes %s", r.Method, r.URL.Path, strings.Join(allow, ", "))})
		return
	}
	writeError(w, &Error{Code: "not_found", Message: fmt.Sprintf("no route %s %s: this daemon serves API %s (see docs/api.md)", r.Method, r.URL.Path, Version)})
}

// ServeHTTP answers one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every write of a JSON body or stream says it is not to be sniffed.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	s.mux.ServeHTTP(w, r)
}

// Serve answers connections from ln until Close. Streams have no write
// timeout; request headers must arrive within 10 seconds.
func (s *Server) Serve(ln net.Listener) error {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		BaseContext: func(net.Listener) context.Context { return s.ctx }}
	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.srv = srv
	s.mu.Unlock()
	return srv.Serve(ln)
}

// Close ends every stream in progress (an exec's process is killed) and,
// when Serve runs, closes its listener and connections.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancel()
	if s.srv != nil {
		return s.srv.Close()
	}
	return nil
}

// context is a request's context that also ends when the server closes.
func (s *Server) context(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	if s.o.Info == nil {
		writeJSON(w, http.StatusOK, &Info{Version: Version})
		return
	}
	in, err := s.o.Info(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, in)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	status := true
	if v := r.URL.Query().Get("status"); v != "" {
		var err error
		if status, err = strconv.ParseBool(v); err != nil {
			writeError(w, badRequest("query \"status\" %q: want true or false", v))
			return
		}
	}
	infos, err := s.m.List()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, statuses(r.Context(), s.m, infos, status))
}

// statuses are the sandboxes of infos with their status (with status
// false, or damaged, their metadata alone). Each sandbox's status is asked
// on its own, bounded in time: one whose agent does not answer (or fails)
// comes with status_error, the others as usual. A sandbox removed
// meanwhile is left out.
func statuses(ctx context.Context, m *sandbox.Manager, infos []*sandbox.Info, status bool) []Sandbox {
	all := make([]*Sandbox, len(infos))
	var wg sync.WaitGroup
	sem := make(chan struct{}, listStatusParallel)
	for i, in := range infos {
		if !status || in.State == sandbox.Damaged {
			all[i] = &Sandbox{Info: *in}
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			st, err := m.Status(ctx, in.Name)
			switch {
			case err == nil:
				all[i] = st
			case !errors.Is(err, sandbox.ErrNotFound): // else removed meanwhile
				all[i] = &Sandbox{Info: *in, StatusError: err.Error()}
			}
		}()
	}
	wg.Wait()
	out := make([]Sandbox, 0, len(all))
	for _, st := range all {
		if st != nil {
			out = append(out, *st)
		}
	}
	return out
}

// listStatusParallel is how many sandboxes a list asks the status of at
// once.
const listStatusParallel = 8

// statusTimeout bounds the status of one sandbox (its agent's answers
// and the walk of its origin, itself bounded at 5 s): a sandbox whose
// agent does not answer does not hang the caller.
const statusTimeout = 10 * time.Second

// generatedName is a new sandbox's name when the request gives none.
func generatedName() string {
	var b [4]byte
	rand.Read(b[:])
	return "sb-" + hex.EncodeToString(b[:])
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if !decode(w, r, &req) {
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, err)
		return
	}
	o := sandbox.CreateOptions{Name: req.Name, Env: req.Env, Limits: req.Limits, Services: req.Services, Runtime: req.Runtime, Guest: req.Guest, MessageTo: req.MessageTo}
	if err := s.createPolicy(&req, &o); err != nil {
		writeError(w, err)
		return
	}
	if err := s.createImage(&req, &o); err != nil {
		writeError(w, err)
		return
	}
	if isDir(req.From) {
		o.Dir = req.From
	} else {
		o.Snapshot = req.From
	}
	ctx, cancel := s.context(r)
	defer cancel()
	for try := 0; ; try++ {
		if req.Name == "" {
			o.Name = generatedName()
		}
		info, err := s.m.Create(ctx, o)
		if errors.Is(err, sandbox.ErrExists) && req.Name == "" && try < 3 {
			continue
		}
		if err != nil {
			writeError(w, secretErr(err))
			return
		}
		writeJSON(w, http.StatusCreated, &Sandbox{Info: *info})
		return
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), statusTimeout)
	defer cancel()
	st, err := s.m.Status(ctx, name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) remove(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	if err := s.m.Remove(context.WithoutCancel(r.Context()), name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) start(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok || !decodeEmpty(w, r) {
		return
	}
	if err := s.m.Start(context.WithoutCancel(r.Context()), name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok || !decodeEmpty(w, r) {
		return
	}
	if err := s.m.Stop(context.WithoutCancel(r.Context()), name); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
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
	fo := sandbox.ForkOptions{N: req.N, Names: req.Names}
	branches, err := s.forkBranches(r.Context(), name, req, &fo)
	if err != nil {
		writeError(w, err)
		return
	}
	infos, err := s.m.Fork(context.WithoutCancel(r.Context()), name, fo)
	if err == nil {
		err = s.setForkBranches(infos, branches)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	out := make([]Sandbox, len(infos))
	for i, in := range infos {
		out[i] = Sandbox{Info: *in}
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
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
	snap, err := s.m.Snapshot(context.WithoutCancel(r.Context()), name, sandbox.SnapshotOptions{Name: req.Name})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snap)
}

// snapshots lists a sandbox's snapshots, a removed sandbox's too: they
// stay, and this is where their ids are found. A name with none that is
// no sandbox is not found.
func (s *Server) snapshots(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(w, r)
	if !ok {
		return
	}
	snaps, err := s.m.Snapshots(name)
	if err == nil && len(snaps) == 0 {
		_, err = s.m.Get(name)
	}
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

func (s *Server) rollback(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
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
	if err := s.m.Rollback(context.WithoutCancel(r.Context()), name, req.Snapshot); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) diff(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	// The changes go out as the walk finds them; the status is sent with
	// the first, so an error before it (an unknown snapshot) is answered
	// as one. An error after it cuts the response short: the client sees
	// a broken array, never a complete-looking part of the diff.
	cw := newChangeWriter(w)
	err := s.m.DiffEach(r.Context(), name, r.URL.Query().Get("snapshot"), cw.write)
	if err != nil {
		if !cw.started {
			writeError(w, err)
			return
		}
		panic(http.ErrAbortHandler)
	}
	cw.end()
}

func (s *Server) ps(w http.ResponseWriter, r *http.Request) {
	c, ok := s.agent(w, r)
	if !ok {
		return
	}
	procs, err := c.Ps(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(procs))
}

func (s *Server) ports(w http.ResponseWriter, r *http.Request) {
	c, ok := s.agent(w, r)
	if !ok {
		return
	}
	ports, err := c.Ports(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(ports))
}

// known returns the {name} of the path when a sandbox of that name
// exists; otherwise it answers the request with the error.
func (s *Server) known(w http.ResponseWriter, r *http.Request) (string, bool) {
	name, ok := pathName(w, r)
	if !ok {
		return "", false
	}
	if _, err := s.m.Get(name); err != nil {
		writeError(w, err)
		return "", false
	}
	return name, true
}

// agent returns the guest agent of the running sandbox the path names.
func (s *Server) agent(w http.ResponseWriter, r *http.Request) (*client.Client, bool) {
	name, ok := s.known(w, r)
	if !ok {
		return nil, false
	}
	// A frozen sandbox's agent cannot answer: a request would wait until
	// someone thaws it, holding the caller (a dashboard's poll, a script)
	// that long. Refuse it at once instead, as exec is refused.
	if why := s.m.Frozen(name); why != "" {
		writeError(w, fmt.Errorf("sandbox %q is %w (%s): its processes cannot answer until tine thaw %s", name, sandbox.ErrFrozen, why, name))
		return nil, false
	}
	return s.agentOf(w, r, name)
}

// agentOf returns the guest agent of sandbox name, frozen or not.
func (s *Server) agentOf(w http.ResponseWriter, r *http.Request, name string) (*client.Client, bool) {
	c, err := s.m.Agent(r.Context(), name)
	if err != nil {
		writeError(w, err)
		return nil, false
	}
	return c, true
}

func (s *Server) fs(w http.ResponseWriter, r *http.Request) {
	cmd := r.PathValue("command")
	if !fsCommandRE().MatchString(cmd) {
		writeError(w, badRequest("fs command %q: want a tine fs subcommand such as import or list", cmd))
		return
	}
	var req FSRequest
	if !decode(w, r, &req) {
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, err)
		return
	}
	if s.o.FS == nil {
		writeError(w, &Error{Code: "not_implemented", Message: "fs " + cmd + ": this server runs no fs commands"})
		return
	}
	var out limitedBuffer
	ctx, cancel := s.context(r)
	defer cancel()
	if err := s.o.FS(ctx, cmd, req, &out); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, &FSResponse{Output: out.String()})
}

// maxFSOutput bounds what an fs command may print into one response.
const maxFSOutput = 64 << 20

// limitedBuffer keeps at most maxFSOutput bytes and fails writes past it.
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > maxFSOutput {
		return 0, &Error{Code: "too_large", Message: fmt.Sprintf("fs output exceeds %d bytes; narrow the command", maxFSOutput)}
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *limitedBuffer) String() string { return string(l.b) }

// nonNil makes an empty list encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
