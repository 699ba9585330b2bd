package main

import (
	"bytes"
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
	if !strings.Contains(out.String(), "demo") {
		t.Fatalf("usage does not list demo:\n%s", out.String())
	}
}

// TestDemo runs the README's main job end to end: real FUSE mounts, real
// `go test` runs inside the sandboxes, a real promotion.
func TestDemo(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"demo", "--dir", t.TempDir()}, &out, &errOut); code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"3 sandboxes forked", "modified  mean.go", "applied; go test in the project: ok", "is refused", "done."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
