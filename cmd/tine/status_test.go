package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStatusStaleness: tine status names the host's project directory
// when it says whether the sandbox is stale, for a fork (made from a
// snapshot) as for the sandbox made from the directory, and counts in
// words that agree with the number.
func TestStatusStaleness(t *testing.T) {
	c, proj := newSandboxCLI(t)
	c.ok("create", "--from", proj, "--name", "s")
	c.ok("fork", "s", "-n", "1")
	for _, sb := range []string{"s", "s-1"} {
		if out := c.ok("status", sb); !strings.Contains(out, "stale      no: "+proj+" has not changed on the host since the sandbox was made") {
			t.Errorf("status %s, nothing changed: %s", sb, out)
		}
	}
	if err := os.WriteFile(filepath.Join(proj, "hello.txt"), []byte("changed on the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []string{"s", "s-1"} {
		if out := c.ok("status", sb); !strings.Contains(out, "stale      yes: since the sandbox was made, "+proj+" on the host has 1 file changed, 0 added, 0 removed") {
			t.Errorf("status %s, hello.txt changed: %s", sb, out)
		}
	}
}
