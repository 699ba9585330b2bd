package mcp_test

import (
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"

	"tine/mcp"
)

// TestFileTools writes and reads files of a sandbox through the tools:
// text and bytes, relative paths in the project, modes, and the errors
// that name what to do.
func TestFileTools(t *testing.T) {
	e := newEnv(t)
	cs := e.session(mcp.Options{}, nil)
	call(t, cs, tool("create", map[string]any{"from": e.project, "name": "f"}), nil)

	var w mcp.WriteFileOut
	call(t, cs, tool("write_file", map[string]any{"sandbox": "f", "path": "run.sh", "text": "#!/bin/sh\necho ran\n", "mode": "0755"}), &w)
	if want := filepath.Join(e.project, "run.sh"); w.Path != want || w.Bytes != 19 {
		t.Fatalf("write_file: %+v, want %s", w, want)
	}
	var ex mcp.ExecOut
	call(t, cs, tool("exec", map[string]any{"sandbox": "f", "argv": []string{"./run.sh"}}), &ex)
	if ex.ExitCode != 0 || ex.Stdout != "ran\n" {
		t.Fatalf("the written script: %+v", ex)
	}
	var r mcp.FileOut
	call(t, cs, tool("read_file", map[string]any{"sandbox": "f", "path": "main.txt"}), &r)
	if r.Text != "v1\n" || r.Size != 3 || r.Base64 != "" {
		t.Fatalf("read_file main.txt: %+v", r)
	}
	bin := []byte{0, 0xff, 0xfe, 'x'}
	call(t, cs, tool("write_file", map[string]any{"sandbox": "f", "path": "/tmp/b", "base64": base64.StdEncoding.EncodeToString(bin)}), nil)
	r = mcp.FileOut{}
	call(t, cs, tool("read_file", map[string]any{"sandbox": "f", "path": "/tmp/b"}), &r)
	if r.Text != "" || r.Base64 != base64.StdEncoding.EncodeToString(bin) || r.Size != 4 {
		t.Fatalf("read_file of bytes: %+v", r)
	}
	for _, c := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"read_file", map[string]any{"sandbox": "f", "path": "/nonexistent"}, "no such file"},
		{"read_file", map[string]any{"sandbox": "f", "path": "/tmp"}, "is a directory"},
		{"read_file", map[string]any{"sandbox": "other", "path": "/etc/hostname"}, "other"},
		{"write_file", map[string]any{"sandbox": "f", "path": "/nodir/x", "text": "x"}, "no such file"},
		{"write_file", map[string]any{"sandbox": "f", "path": "x", "text": "x", "base64": "eA=="}, "not both"},
		{"write_file", map[string]any{"sandbox": "f", "path": "x", "text": "x", "mode": "9"}, "octal"},
		{"write_file", map[string]any{"sandbox": "f", "path": "x", "base64": "!!"}, "base64"},
	} {
		if msg := callFails(t, cs, tool(c.name, c.args)); !strings.Contains(msg, c.want) {
			t.Errorf("%s %v: %q, want it to say %q", c.name, c.args, msg, c.want)
		}
	}
}
