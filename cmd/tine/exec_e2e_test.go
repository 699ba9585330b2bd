package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
)

// TestExecStartFailures: through the CLI and a real daemon, a command
// that cannot start gives the exit status a shell gives (127 not found,
// 126 not executable or no such working directory) and says why on
// stderr, naming the command and the sandbox; with --json the last line
// of stdout is the result, carrying the exit code and the error.
func TestExecStartFailures(t *testing.T) {
	c, base := daemonCLI(t)
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	plain := filepath.Join(proj, "notes.txt")
	os.WriteFile(plain, []byte("not a program\n"), 0o644)
	c.ok("create", "--from", proj, "--name", "a")

	for _, tc := range []struct {
		args     []string
		code     int
		mentions []string
	}{
		{[]string{"exec", "a", "--", "nosuchcmd", "x"}, 127, []string{"nosuchcmd", "command not found", `sandbox "a"`}},
		{[]string{"exec", "-i", "a", "--", "nosuchcmd"}, 127, []string{"nosuchcmd", "command not found", `sandbox "a"`}},
		{[]string{"exec", "a", "--", "/no/such/path"}, 127, []string{"/no/such/path", "no such file", `sandbox "a"`}},
		{[]string{"exec", "a", "--", plain}, 126, []string{plain, "permission denied", `sandbox "a"`}},
		{[]string{"exec", "a", "--", "/tmp"}, 126, []string{"/tmp", "is a directory"}},
		{[]string{"exec", "--cwd", "/no/such/dir", "a", "--", "true"}, 126, []string{"working directory /no/such/dir", "no such file", `sandbox "a"`}},
		{[]string{"exec", "--cwd", plain, "a", "--", "true"}, 126, []string{"working directory " + plain, "not a directory"}},
	} {
		out, errOut, code := c.run("", tc.args...)
		if code != tc.code || out != "" {
			t.Errorf("tine %q: exit %d, stdout %q, stderr %q; want exit %d", tc.args, code, out, errOut, tc.code)
			continue
		}
		for _, m := range tc.mentions {
			if !strings.Contains(errOut, m) {
				t.Errorf("tine %q: stderr %q does not say %q", tc.args, errOut, m)
			}
		}
	}

	// --json: one result line on stdout, the reason on stderr too.
	type result struct {
		ExitCode int        `json:"exit_code"`
		Signal   int        `json:"signal"`
		Error    *api.Error `json:"error"`
	}
	out, errOut, code := c.run("", "exec", "--json", "a", "--", "nosuchcmd")
	var res result
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 127 || res.ExitCode != 127 || res.Error == nil ||
		res.Error.Code != api.CodeCommandNotFound || res.Error.ExitCode != 127 || !strings.Contains(res.Error.Message, "nosuchcmd") ||
		!strings.Contains(errOut, "nosuchcmd") {
		t.Errorf("exec --json nosuchcmd: exit %d, stdout %q (%v), stderr %q", code, out, err, errOut)
	}
	out, _, code = c.run("", "exec", "--json", "a", "--", "sh", "-c", "echo hi; echo oops >&2; exit 3")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	var stdout, stderr []byte
	for _, l := range lines[:len(lines)-1] {
		var ev api.ExecEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("exec --json: line %q: %v", l, err)
		}
		stdout, stderr = append(stdout, ev.Stdout...), append(stderr, ev.Stderr...)
	}
	res = result{}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || code != 3 || res.ExitCode != 3 || res.Error != nil ||
		string(stdout) != "hi\n" || string(stderr) != "oops\n" {
		t.Errorf("exec --json of a command that exits 3: exit %d, stdout %q", code, out)
	}
	out, _, code = c.run("", "exec", "--json", "nosuch", "--", "true")
	res = result{}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 1 || res.ExitCode != 1 || res.Error == nil || res.Error.Code != "not_found" {
		t.Errorf("exec --json in an unknown sandbox: exit %d, stdout %q", code, out)
	}
	// The sandbox runs commands after the failures; a command that runs
	// and exits 127 gives 127 and nothing from tine.
	if out, errOut, code := c.run("", "exec", "a", "--", "sh", "-c", "echo ok; exit 127"); code != 127 || out != "ok\n" || errOut != "" {
		t.Errorf("exit 127 from a command that ran: exit %d, %q, %q", code, out, errOut)
	}
}
