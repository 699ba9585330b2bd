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
	for _, c := range []string{"create", "exec", "fork", "diff", "promote", "serve", "fs", "store", "vm"} {
		if !strings.Contains(out.String(), "  "+c+" ") {
			t.Errorf("usage does not list %s:\n%s", c, out.String())
		}
	}
}
