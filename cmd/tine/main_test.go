package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func TestUnknownCommandExits2(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"no-such-command"}, &out, &errOut); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	if !strings.Contains(errOut.String(), `unknown command "no-such-command"`) {
		t.Fatalf("stderr %q does not name the command", errOut.String())
	}
}

func TestUsageListsCommands(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for _, c := range []string{"create", "exec", "fork", "diff", "promote", "serve", "fs", "store", "vm"} {
		if !strings.Contains(out.String(), "  "+c+" ") {
			t.Errorf("usage does not list %s:\n%s", c, out.String())
		}
	}
}

// A --from that is not a directory is a usage error saying why: missing,
// or a file; neither reaches a daemon.
func TestCreateFromNotADirectory(t *testing.T) {
	file := t.TempDir() + "/file"
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for from, why := range map[string]string{file: "not a directory", t.TempDir() + "/missing": "no such file or directory"} {
		var out, errOut bytes.Buffer
		code := run([]string{"create", "--root", t.TempDir(), "--from", from}, &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), from+": "+why) {
			t.Errorf("create --from %s: exit %d, %q; want 2 and %q", from, code, errOut.String(), why)
		}
		// The same, given as the argument.
		out.Reset()
		errOut.Reset()
		code = run([]string{"create", "--root", t.TempDir(), from}, &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), from+": "+why) {
			t.Errorf("create %s: exit %d, %q; want 2 and %q", from, code, errOut.String(), why)
		}
	}
	// Given twice, differently: which one is meant is not guessed.
	var out, errOut bytes.Buffer
	if code := run([]string{"create", "--root", t.TempDir(), "--from", "/a", "/b"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "once") {
		t.Errorf("create --from /a /b: exit %d, %q", code, errOut.String())
	}
	// A command with no arguments names what it was given.
	errOut.Reset()
	if code := run([]string{"ls", "--root", t.TempDir(), "x"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `takes no arguments, got ["x"]`) {
		t.Errorf("ls x: exit %d, %q", code, errOut.String())
	}
}

// A fork count out of range is refused before any daemon is asked.
func TestForkCountOutOfRange(t *testing.T) {
	for n, want := range map[string]string{"0": "at least 1", "65": "-n 65: one fork makes at most 64 sandboxes"} {
		var out, errOut bytes.Buffer
		if code := run([]string{"fork", "--root", t.TempDir(), "a", "-n", n}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), want) {
			t.Errorf("fork -n %s: exit %d, %q; want 2 and %q", n, code, errOut.String(), want)
		}
	}
}
