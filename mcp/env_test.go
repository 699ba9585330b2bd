package mcp_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"tine/api"
	"tine/api/client"
	"tine/cowfs"
	"tine/internal/testagent"
	"tine/mcp"
	"tine/oci"
	"tine/sandbox"
	"tine/sandbox/ns"
)

var agentPath string

func TestMain(m *testing.M) {
	testagent.Main(m, &agentPath)
}

// env is a daemon (manager and API server over a fresh store) and a
// project directory to make sandboxes from.
type env struct {
	t       *testing.T
	project string
	c       *client.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{t: t, project: filepath.Join(base, "project")}
	if err := os.MkdirAll(e.project, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(e.project, "main.txt"), []byte("v1\n"), 0o644)
	fs, err := cowfs.Open(filepath.Join(base, "cowfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := ns.New(agentPath)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "state")
	m, err := sandbox.Open(context.Background(), root, fs, sandbox.Options{Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := api.Listen(root, "")
	if err != nil {
		t.Fatal(err)
	}
	images, err := oci.Open(filepath.Join(root, "images"), oci.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewServer(m, api.ServerOptions{Images: images})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	e.c = client.New(filepath.Join(root, api.SocketName))
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
		if err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
		if err := fs.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// session connects an in-process MCP client to a new server session.
func (e *env) session(o mcp.Options, copts *sdk.ClientOptions) *sdk.ClientSession {
	e.t.Helper()
	o.Client = e.c
	st, ct := sdk.NewInMemoryTransports()
	ss, err := mcp.New(o).Connect(ctxT(e.t), st, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, copts).Connect(ctxT(e.t), ct, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cs.Close(); ss.Wait() })
	return cs
}
