package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"tine/api"
	"tine/api/client"
	"tine/guestagent/proto"
)

// TestExecStartFailures: a command that cannot start is answered with
// status 422, a code per reason and the exit status a shell gives (127
// not found, 126 not executable or no such working directory), over the
// streaming endpoint and the WebSocket alike; the message names the
// sandbox and the command; the audit record carries the exit status.
func TestExecStartFailures(t *testing.T) {
	e := newEnv(t)
	e.create("s")
	e.sh("s", "printf 'not a program\\n' > /tmp/plain.txt; chmod 644 /tmp/plain.txt")
	ctx := ctxT(t)
	for _, tc := range []struct {
		argv       []string
		dir        string
		code, want string
		status     int
	}{
		{[]string{"nosuchcmd", "arg"}, "", api.CodeCommandNotFound, "nosuchcmd: command not found", 127},
		{[]string{"/no/such/path"}, "", api.CodeCommandNotFound, "/no/such/path: no such file or directory", 127},
		{[]string{"/tmp/plain.txt"}, "", api.CodeCommandNotExecutable, "/tmp/plain.txt: permission denied", 126},
		{[]string{"/tmp"}, "", api.CodeCommandNotExecutable, "/tmp: is a directory", 126},
		{[]string{"true"}, "/no/such/dir", api.CodeBadDir, "working directory /no/such/dir: no such file or directory", 126},
	} {
		req := api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: tc.argv, Dir: tc.dir}}
		for _, ws := range []bool{false, true} {
			eio := client.ExecIO{Stdout: io.Discard, Stderr: io.Discard}
			if ws {
				eio.Stdin = strings.NewReader("")
			}
			_, err := e.c.Exec(ctx, "s", req, eio)
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Code != tc.code || ce.ExitCode != tc.status ||
				!strings.Contains(ce.Message, tc.want) || !strings.Contains(ce.Message, `sandbox "s"`) {
				t.Errorf("%q in %q (ws %v): %#v (%v), want %s, exit code %d, naming the sandbox and %q", tc.argv, tc.dir, ws, ce, err, tc.code, tc.status, tc.want)
				continue
			}
			if !ws && ce.Status != http.StatusUnprocessableEntity {
				t.Errorf("%q: status %d, want 422", tc.argv, ce.Status)
			}
		}
	}

	// The raw answer: 422 and the JSON error with its exit_code.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", e.c.Socket())
	}}}
	resp, err := hc.Post("http://tine/v1/sandboxes/s/exec", "application/json", strings.NewReader(`{"argv":["nosuchcmd"]}`))
	if err != nil {
		t.Fatal(err)
	}
	var ae api.Error
	err = json.NewDecoder(resp.Body).Decode(&ae)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 422 || ae.Code != "command_not_found" || ae.ExitCode != 127 {
		t.Fatalf("raw exec of nosuchcmd: %d %+v %v", resp.StatusCode, ae, err)
	}

	// A command that ran and exited 127 is an exit, not an error; the
	// sandbox runs commands after the failures.
	if _, _, ex := e.run("s", shReq("exit 127"), nil); ex.Code != 127 {
		t.Fatalf("exit 127: %+v", ex)
	}

	// The audit log records the failed start with its exit status.
	rc, err := e.c.Audit(ctx, "s", 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	found := false
	for sc := bufio.NewScanner(rc); sc.Scan(); {
		var rec struct {
			Kind   string `json:"kind"`
			Fields struct {
				Argv     []string `json:"argv"`
				Error    string   `json:"error"`
				ExitCode *int     `json:"exit_code"`
			} `json:"fields"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Kind == "exec" && len(rec.Fields.Argv) > 0 && rec.Fields.Argv[0] == "nosuchcmd" {
			found = true
			if rec.Fields.ExitCode == nil || *rec.Fields.ExitCode != 127 || !strings.Contains(rec.Fields.Error, "command not found") {
				t.Errorf("audit of nosuchcmd: %s", sc.Bytes())
			}
		}
	}
	if !found {
		t.Error("no audit record of nosuchcmd")
	}
}
