package api_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tine/api"
	"tine/api/client"
	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/internal/syncbuf"
	"tine/internal/testagent"
	"tine/oci"
	"tine/sandbox"
	"tine/sandbox/ns"
)

var agentPath string

func TestMain(m *testing.M) {
	if sock := os.Getenv("TINE_PEER_DIAL"); sock != "" {
		peerDial(sock) // TestPeerCheck's peer, run as another user
		os.Exit(0)
	}
	testagent.Main(m, &agentPath)
}

// testGroup is a group every test host has; the socket is shared with it.
const testGroup = "daemon"

// env is one test's daemon: a manager over a fresh cowfs root, served on
// the state root's socket, and a client of it.
type env struct {
	t       *testing.T
	root    string
	project string
	fs      *cowfs.FS
	m       *sandbox.Manager
	srv     *api.Server
	served  chan error
	c       *client.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{t: t, root: filepath.Join(base, "state"), project: filepath.Join(base, "project")}
	if err := os.MkdirAll(filepath.Join(e.project, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(e.project, "src", "main.txt"), []byte("v1\n"), 0o644)
	fs, err := cowfs.Open(filepath.Join(base, "cowfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.fs = fs
	e.start()
	t.Cleanup(func() {
		e.stop()
		if err := fs.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// start opens a manager on the state root and serves it.
func (e *env) start() {
	e.t.Helper()
	rt, err := ns.New(agentPath)
	if err != nil {
		e.t.Fatal(err)
	}
	e.m, err = sandbox.Open(context.Background(), e.root, e.fs, sandbox.Options{Runtime: rt})
	if err != nil {
		e.t.Fatal(err)
	}
	ln, err := api.Listen(e.root, testGroup)
	if err != nil {
		e.t.Fatal(err)
	}
	images, err := oci.Open(filepath.Join(e.root, "images"), oci.Limits{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.srv = api.NewServer(e.m, api.ServerOptions{Images: images})
	e.served = make(chan error, 1)
	go func() { e.served <- e.srv.Serve(ln) }()
	e.c = client.New(filepath.Join(e.root, api.SocketName))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.c.WaitReady(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// stop closes the server and the manager, as a daemon's exit does.
func (e *env) stop() {
	if e.srv == nil {
		return
	}
	e.srv.Close()
	if err := <-e.served; !errors.Is(err, http.ErrServerClosed) {
		e.t.Errorf("Serve: %v", err)
	}
	if err := e.m.Close(context.Background()); err != nil {
		e.t.Error(err)
	}
	e.srv = nil
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) create(name string) *api.Sandbox {
	e.t.Helper()
	sb, err := e.c.Create(ctxT(e.t), api.CreateRequest{Name: name, From: e.project})
	if err != nil {
		e.t.Fatal(err)
	}
	return sb
}

// run execs argv in sandbox name and returns stdout, stderr and the exit.
func (e *env) run(name string, req api.ExecRequest, stdin io.Reader) (string, string, proto.Exit) {
	e.t.Helper()
	var out, errb bytes.Buffer
	ex, err := e.c.Exec(ctxT(e.t), name, req, client.ExecIO{Stdin: stdin, Stdout: &out, Stderr: &errb})
	if err != nil {
		e.t.Fatal(err)
	}
	return out.String(), errb.String(), ex
}

func (e *env) sh(name, script string) string {
	e.t.Helper()
	out, errs, ex := e.run(name, api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"sh", "-c", script}}}, nil)
	if ex.Code != 0 {
		e.t.Fatalf("%s: %q exited %d: %s%s", name, script, ex.Code, out, errs)
	}
	return out
}

func shReq(script string) api.ExecRequest {
	return api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"sh", "-c", script}}}
}

// TestCreateExec: a sandbox created from a host directory, with a
// generated name, runs a command whose stdout, stderr and exit code come
// back apart; with stdin the command reads it to its end.
func TestCreateExec(t *testing.T) {
	e := newEnv(t)
	sb, err := e.c.Create(ctxT(t), api.CreateRequest{From: e.project})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sb.Name, "sb-") || sb.State != sandbox.Running || sb.ProjectPath != e.project {
		t.Fatalf("created %+v", sb)
	}
	out, errs, ex := e.run(sb.Name, shReq("cat "+e.project+"/src/main.txt; echo oops >&2; exit 3"), nil)
	if out != "v1\n" || errs != "oops\n" || ex.Code != 3 || ex.PID == 0 {
		t.Fatalf("stdout %q, stderr %q, exit %+v", out, errs, ex)
	}
	big := strings.Repeat("0123456789abcdef", 40000) // 640 KB, many frames each way
	out, _, ex = e.run(sb.Name, api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"sh", "-c", "cat; echo end"}}}, strings.NewReader(big))
	if out != big+"end\n" || ex.Code != 0 {
		t.Fatalf("stdin echoed %d bytes (want %d), exit %+v", len(out), len(big)+4, ex)
	}
}

// waitFor polls until cond holds or fails the test after 20 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestExecInteractive: over the WebSocket a command runs on a TTY of the
// requested size, sees a resize, reads typed input and takes a signal.
func TestExecInteractive(t *testing.T) {
	e := newEnv(t)
	e.create("tty")
	req := shReq(`stty size; read x; while [ "$(stty size)" = "24 80" ]; do sleep 0.02; done; stty size; echo "got $x"; trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.05; done`)
	req.TTY, req.Rows, req.Cols = true, 24, 80
	stdinR, stdinW := io.Pipe()
	resize := make(chan proto.Resize, 1)
	sigs := make(chan proto.Signal, 1)
	var out syncbuf.Buffer
	done := make(chan error, 1)
	var ex proto.Exit
	go func() {
		var err error
		ex, err = e.c.Exec(ctxT(t), "tty", req, client.ExecIO{Stdin: stdinR, Stdout: &out, Resize: resize, Signals: sigs})
		done <- err
	}()
	waitFor(t, "the first stty size", func() bool { return strings.Contains(out.String(), "24 80") })
	io.WriteString(stdinW, "hello\n")
	resize <- proto.Resize{Rows: 40, Cols: 100}
	waitFor(t, "the resized stty size", func() bool { return strings.Contains(out.String(), "40 100") })
	waitFor(t, "ready", func() bool { return strings.Contains(out.String(), "ready") })
	if !strings.Contains(out.String(), "got hello") {
		t.Fatalf("the TTY's output lacks the input: %q", out.String())
	}
	sigs <- proto.Signal{Signal: 15}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ex.Code != 7 || !strings.Contains(out.String(), "term") {
		t.Fatalf("after SIGTERM: exit %+v, output %q", ex, out.String())
	}
}

// TestExecTimeoutAndDisconnect: a command past its timeout is killed and
// reported so; a client that leaves kills its command.
func TestExecTimeoutAndDisconnect(t *testing.T) {
	e := newEnv(t)
	e.create("t")
	req := shReq("echo before; sleep 1000")
	req.Timeout = 300 * time.Millisecond
	start := time.Now()
	out, _, ex := e.run("t", req, nil)
	if !ex.TimedOut || ex.Code != -1 || out != "before\n" {
		t.Fatalf("exit %+v, output %q, want a timed-out kill", ex, out)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the timeout of 300ms took %v to end the command", d)
	}
	for _, interactive := range []bool{false, true} {
		ctx, cancel := context.WithCancel(ctxT(t))
		var buf syncbuf.Buffer
		done := make(chan error, 1)
		eio := client.ExecIO{Stdout: &buf}
		if interactive {
			eio.Stdin = strings.NewReader("")
		}
		go func() {
			_, err := e.c.Exec(ctx, "t", shReq("echo started; exec sleep 4242"), eio)
			done <- err
		}()
		waitFor(t, "started", func() bool { return strings.Contains(buf.String(), "started") })
		cancel()
		if err := <-done; err == nil {
			t.Fatal("Exec returned no error after its context ended")
		}
		waitFor(t, "the command's death", func() bool {
			procs, err := e.c.Ps(ctxT(t), "t")
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range procs {
				if strings.Join(p.Argv, " ") == "sleep 4242" {
					return false
				}
			}
			return true
		})
	}
}

// TestForkSnapshotRollbackDiff: fork -n 2 gives two sandboxes that run
// commands and diverge; a snapshot and rollback restore a file; diff
// lists the project's changes.
func TestForkSnapshotRollbackDiff(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("p")
	e.sh("p", "echo parent > "+e.project+"/state.txt")
	kids, err := e.c.Fork(ctx, "p", api.ForkRequest{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 || kids[0].Name != "p-1" || kids[1].Name != "p-2" || kids[0].State != sandbox.Running {
		t.Fatalf("forks: %+v", kids)
	}
	for i, k := range kids {
		if out := e.sh(k.Name, "cat "+e.project+"/state.txt"); out != "parent\n" {
			t.Fatalf("%s: %q", k.Name, out)
		}
		e.sh(k.Name, fmt.Sprintf("echo kid%d > %s/state.txt", i, e.project))
	}
	for i, k := range kids {
		if out, want := e.sh(k.Name, "cat "+e.project+"/state.txt"), fmt.Sprintf("kid%d\n", i); out != want {
			t.Fatalf("%s: %q, want %q", k.Name, out, want)
		}
	}

	snap, err := e.c.Snapshot(ctx, "p", api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Sandbox != "p" || snap.ID == "" {
		t.Fatalf("snapshot %+v", snap)
	}
	e.sh("p", "echo later > "+e.project+"/state.txt; echo gone > "+e.project+"/src/main.txt")
	if err := e.c.Rollback(ctx, "p", api.RollbackRequest{Snapshot: snap.ID}); err != nil {
		t.Fatal(err)
	}
	if out := e.sh("p", "cat "+e.project+"/state.txt "+e.project+"/src/main.txt"); out != "parent\nv1\n" {
		t.Fatalf("after rollback: %q", out)
	}
	e.sh("p", "echo changed > "+e.project+"/src/main.txt; chmod 600 "+e.project+"/src/main.txt; "+
		"ln -s main.txt "+e.project+"/src/link; mkfifo "+e.project+"/src/pipe; printf x > "+e.project+"/src/$(printf '\\377')")
	changes, err := e.c.Diff(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, fmt.Sprintf("%s %s %s %d %o", c.Kind, c.Type, c.Path, c.Size, c.Mode))
	}
	if want := "added symlink src/link 8 777,modified file src/main.txt 8 600,added fifo src/pipe 0 644,added file src/\uFFFD 1 644,added file state.txt 7 644"; strings.Join(got, ",") != want {
		t.Fatalf("diff = %q, want %q", got, want)
	}
	// An unknown snapshot is an error answered before any change is sent.
	if _, err := e.c.Diff(ctx, "p", "no-such-snapshot"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("diff since an unknown snapshot: %v, want not found", err)
	}
	// A name that is not UTF-8 comes back exactly in path_b64.
	if raw, err := base64.StdEncoding.DecodeString(changes[3].PathB64); err != nil || string(raw) != "src/\xff" || changes[0].PathB64 != "" {
		t.Errorf("path_b64 of src/\\xff: %q %v; of src/link: %q", raw, err, changes[0].PathB64)
	}
}

// TestPsPortsFiles: ps and ports see a listening server; a file put
// through the API is read back whole with its mode.
func TestPsPortsFiles(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create("f")
	e.sh("f", "busybox nc -l -p 7171 >/dev/null 2>&1 </dev/null & true")
	waitFor(t, "port 7171", func() bool {
		ports, err := e.c.Ports(ctx, "f")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ports {
			if p.Port == 7171 && strings.HasPrefix(p.Proto, "tcp") {
				return true
			}
		}
		return false
	})
	procs, err := e.c.Ps(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		found = found || strings.Contains(strings.Join(p.Argv, " "), "nc -l -p 7171")
	}
	if !found {
		t.Fatalf("ps lacks the listener: %+v", procs)
	}

	content := bytes.Repeat([]byte("file\x00bytes\n"), 50000)
	p := e.project + "/put.bin"
	if err := e.c.PutFile(ctx, "f", p, 0o640, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if out := e.sh("f", "stat -c %a "+p); out != "640\n" {
		t.Fatalf("mode in the sandbox: %q", out)
	}
	var back bytes.Buffer
	if err := e.c.GetFile(ctx, "f", p, &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Bytes(), content) {
		t.Fatalf("got %d bytes back, want %d", back.Len(), len(content))
	}
	err = e.c.GetFile(ctx, "f", "/no/such/file", io.Discard)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 400 || !strings.Contains(ce.Message, "/no/such/file") {
		t.Fatalf("get of a missing file: %v", err)
	}
}

// TestErrors: unknown sandboxes are 404 and match sandbox.ErrNotFound;
// bad bodies are 400 naming what is wrong; a stopped sandbox is
// not_running; a taken name is exists.
func TestErrors(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	for what, err := range map[string]error{
		"stop":   e.c.Stop(ctx, "nope"),
		"remove": e.c.Remove(ctx, "nope"),
		"exec":   func() error { _, err := e.c.Exec(ctx, "nope", shReq("true"), client.ExecIO{}); return err }(),
		"exec/ws": func() error {
			_, err := e.c.Exec(ctx, "nope", shReq("true"), client.ExecIO{Stdin: strings.NewReader("")})
			return err
		}(),
		"ps":   func() error { _, err := e.c.Ps(ctx, "nope"); return err }(),
		"diff": func() error { _, err := e.c.Diff(ctx, "nope", ""); return err }(),
	} {
		var ce *client.Error
		if !errors.Is(err, sandbox.ErrNotFound) || !errors.As(err, &ce) || !strings.Contains(ce.Message, `"nope"`) {
			t.Errorf("%s of an unknown sandbox: %v, want not_found naming it", what, err)
		}
		if ce != nil && what != "exec/ws" && ce.Status != 404 {
			t.Errorf("%s: status %d, want 404", what, ce.Status)
		}
	}
	e.create("x")
	if _, err := e.c.Create(ctx, api.CreateRequest{Name: "x", From: e.project}); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("create of a taken name: %v", err)
	}
	if err := e.c.Stop(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Ps(ctx, "x"); !errors.Is(err, sandbox.ErrNotRunning) {
		t.Fatalf("ps of a stopped sandbox: %v", err)
	}
	if err := e.c.Start(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if out := e.sh("x", "echo back"); out != "back\n" {
		t.Fatalf("after stop and start: %q", out)
	}

	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", e.c.Socket())
	}}}
	for _, tc := range []struct {
		method, path, body string
		status             int
		code, mention      string
	}{
		{"POST", "/v1/sandboxes", `{"from":`, 400, "bad_request", "JSON"},
		{"POST", "/v1/sandboxes", `{"from":"/tmp","nmae":"x"}`, 400, "bad_request", `"nmae"`},
		{"POST", "/v1/sandboxes", `{"from":5}`, 400, "bad_request", `"from"`},
		{"POST", "/v1/sandboxes", `{"from":"/tmp"} {}`, 400, "bad_request", "after"},
		{"POST", "/v1/sandboxes", `{}`, 400, "bad_request", `"from"`},
		{"POST", "/v1/sandboxes", `{"from":"/tmp","name":"../x"}`, 400, "bad_request", `"name"`},
		{"POST", "/v1/sandboxes", `{"from":"/tmp","env":["NOEQUALS"]}`, 400, "bad_request", `"env"`},
		{"POST", "/v1/sandboxes", `{"from":"` + strings.Repeat("a", api.MaxRequestBytes) + `"}`, 413, "too_large", "exceeds"},
		{"POST", "/v1/sandboxes", `{"from":"snap-missing"}`, 404, "not_found", "snap-missing"},
		{"POST", "/v1/sandboxes/x/exec", `{"argv":[]}`, 400, "bad_request", `"argv"`},
		{"POST", "/v1/sandboxes/x/fork", `{"n":1000}`, 400, "bad_request", `"n"`},
		{"GET", "/v1/nothing", ``, 404, "not_found", "/v1/nothing"},
		{"DELETE", "/v1/info", ``, 405, "bad_request", "GET"},
		{"POST", "/v1/fs/list", `{"args":[]}`, 501, "not_implemented", "fs list"},
	} {
		req, _ := http.NewRequest(tc.method, "http://tine"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var ae api.Error
		json.Unmarshal(b, &ae)
		if resp.StatusCode != tc.status || ae.Code != tc.code || !strings.Contains(ae.Message, tc.mention) {
			t.Errorf("%s %s %.40q: %d %s, want %d %s mentioning %s", tc.method, tc.path, tc.body, resp.StatusCode, b, tc.status, tc.code, tc.mention)
		}
	}
	if err := e.c.Remove(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Stop(ctx, "x"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("stop after remove: %v", err)
	}
}

// TestRestart: a daemon that ends and starts again on the same state root
// finds its sandboxes stopped with their files, and runs them again.
func TestRestart(t *testing.T) {
	e := newEnv(t)
	e.create("keep")
	e.sh("keep", "echo kept > "+e.project+"/k.txt")
	e.stop()
	if _, err := os.Stat(filepath.Join(e.root, api.SocketName)); !os.IsNotExist(err) {
		t.Fatalf("the socket outlived the daemon: %v", err)
	}
	e.start()
	info, err := e.m.Get("keep")
	if err != nil || info.State != sandbox.Stopped {
		t.Fatalf("after the restart: %+v, %v", info, err)
	}
	if _, err := e.c.Ps(ctxT(t), "keep"); !errors.Is(err, sandbox.ErrNotRunning) {
		t.Fatalf("ps before start: %v", err)
	}
	if err := e.c.Start(ctxT(t), "keep"); err != nil {
		t.Fatal(err)
	}
	if out := e.sh("keep", "cat "+e.project+"/k.txt"); out != "kept\n" {
		t.Fatalf("after restart: %q", out)
	}
}

// TestStatusSnapshotsLogsPromote: get and list report live state;
// labelled snapshots are listed and roll back by label; the services' output streams as logs; promote writes the
// project's changes to the host directory.
func TestStatusSnapshotsLogsPromote(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	if _, err := e.c.Create(ctx, api.CreateRequest{Name: "s", From: e.project,
		Services: []string{"echo service-up; exec sleep 1000"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the service's process", func() bool {
		st, err := e.c.Get(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		return st.State == sandbox.Running && st.Processes >= 2
	})
	list, err := e.c.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "s" || list[0].Processes < 2 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	// ?status=false: the metadata alone, nothing asked of the agent.
	brief, err := e.c.ListInfo(ctx)
	if err != nil || len(brief) != 1 || brief[0].Name != "s" || brief[0].State != sandbox.Running ||
		brief[0].Processes != 0 || brief[0].Stale.Unknown != "" || brief[0].Stale.Changed != 0 {
		t.Fatalf("list with status=false: %+v, %v", brief, err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(e.root, api.SocketName))
	}}}
	resp, err := hc.Get("http://tine/v1/sandboxes?status=maybe")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), `query \"status\"`) {
		t.Fatalf("list with status=maybe: %d %s, want 400 naming the parameter", resp.StatusCode, body)
	}
	if _, err := e.c.Get(ctx, "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get of an unknown sandbox: %v", err)
	}

	logs, err := e.c.Logs(ctx, "s", sandbox.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	var lb syncbuf.Buffer
	go io.Copy(&lb, logs)
	waitFor(t, "the service's output in the logs", func() bool { return strings.Contains(lb.String(), "service-up") })
	logs.Close()

	e.sh("s", "echo one > "+e.project+"/f")
	if _, err := e.c.Snapshot(ctx, "s", api.SnapshotRequest{Name: "first"}); err != nil {
		t.Fatal(err)
	}
	e.sh("s", "echo two > "+e.project+"/f")
	snaps, err := e.c.Snapshots(ctx, "s")
	if err != nil || len(snaps) != 1 || snaps[0].Name != "first" {
		t.Fatalf("snapshots: %+v, %v", snaps, err)
	}
	if err := e.c.Rollback(ctx, "s", api.RollbackRequest{Snapshot: "first"}); err != nil {
		t.Fatal(err)
	}
	if out := e.sh("s", "cat "+e.project+"/f"); out != "one\n" {
		t.Fatalf("after rollback by label: %q", out)
	}

	res, err := e.c.Promote(ctx, "s", api.PromoteRequest{DryRun: true})
	if err != nil || res.Applied || len(res.Changes) != 1 || res.Changes[0].Path != "f" {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(e.project, "f")); !os.IsNotExist(err) {
		t.Fatal("a dry run wrote to the host")
	}
	if res, err = e.c.Promote(ctx, "s", api.PromoteRequest{}); err != nil || !res.Applied {
		t.Fatalf("promote: %+v, %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "f")); string(b) != "one\n" {
		t.Fatalf("the host's file after promote: %q", b)
	}
	// A removed sandbox's snapshots stay listed; an unknown name is not
	// found.
	if err := e.c.Remove(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if snaps, err := e.c.Snapshots(ctx, "s"); err != nil || len(snaps) != 1 {
		t.Fatalf("snapshots of the removed sandbox: %+v, %v", snaps, err)
	}
	if _, err := e.c.Snapshots(ctx, "never-made"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("snapshots of an unknown sandbox: %v", err)
	}
}
