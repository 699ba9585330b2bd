package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"tine/api"
	"tine/api/client"
	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/internal/testagent"
	"tine/sandbox"
	"tine/sandbox/ns"
)

var agentPath string

func TestMain(m *testing.M) {
	testagent.Main(m, &agentPath)
}

// TestRace: of 5 forks, only the one whose index is 3 passes its test; it
// is kept with its change and everything else is removed.
func TestRace(t *testing.T) {
	base := t.TempDir()
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
	srv := api.NewServer(m, api.ServerOptions{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
		m.Close(context.Background())
		fs.Close()
	}()
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	c := client.New(filepath.Join(root, api.SocketName))

	winner, err := race(t.Context(), c, proj, 5, "echo $FORK_INDEX > idx", `[ "$(cat idx)" = 3 ]`)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := c.Exec(t.Context(), winner, api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"cat", filepath.Join(proj, "idx")}}}, client.ExecIO{Stdout: &out}); err != nil || out.String() != "3\n" {
		t.Errorf("winner %s: idx %q %v", winner, out.String(), err)
	}
	list, _ := c.List(t.Context())
	if len(list) != 1 || list[0].Name != winner {
		t.Errorf("left: %+v, want only %s", list, winner)
	}
	if _, err := race(t.Context(), c, proj, 2, "true", "false"); err == nil {
		t.Errorf("a race nobody wins returned no error")
	}
}
