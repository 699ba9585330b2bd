package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"tine/sandbox/vm"
)

// TestLinuxForkSaysWhyNotRun: on a host that cannot run Linux guests at
// speed, the Linux fork section names the host's KVM and the reason
// instead of printing nothing.
func TestLinuxForkSaysWhyNotRun(t *testing.T) {
	p := vm.Probe()
	if p.Support == vm.Native {
		t.Skip("this host runs Linux guests natively: the section measures (see bench/vmm)")
	}
	var b bytes.Buffer
	if err := linuxFork(context.Background(), options{forks: 5}, &b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "Not run") || !strings.Contains(out, kvmKind()) || !strings.Contains(out, p.Detail) {
		t.Fatalf("section: %q", out)
	}
	t.Log(out)
}
