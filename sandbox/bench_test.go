package sandbox_test

import (
	"context"
	"fmt"
	"os/exec"
	"testing"

	"tine/sandbox"
)

// BenchmarkCreateFirstCommand: from Create to the answer of the first
// command (echo hi) in the new sandbox; Remove is not timed.
func BenchmarkCreateFirstCommand(b *testing.B) {
	e := newEnv(b, 4)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("b%d", i)
		e.create(name, sandbox.Limits{})
		if out := e.mustSh(name, "echo hi"); out != "hi\n" {
			b.Fatal(out)
		}
		b.StopTimer()
		if err := e.m.Remove(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkFork10: one Fork of a running sandbox into 10 running sandboxes.
func BenchmarkFork10(b *testing.B) {
	e := newEnv(b, 10)
	ctx := context.Background()
	e.create("p", sandbox.Limits{})
	e.mustSh("p", "echo x > /etc/tine-bench; mkdir -p /root/.cache && head -c 1000000 /dev/urandom > /root/.cache/blob")
	for b.Loop() {
		kids, err := e.m.Fork(ctx, "p", sandbox.ForkOptions{N: 10})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		for _, k := range kids {
			if err := e.m.Remove(ctx, k.Name); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
}

// BenchmarkBwrap is the bar to compare with: bubblewrap running true in
// new namespaces of every kind.
func BenchmarkBwrap(b *testing.B) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		b.Fatal("bubblewrap is not installed (apt-get install bubblewrap)")
	}
	for b.Loop() {
		if out, err := exec.Command("bwrap", "--unshare-all", "--ro-bind", "/", "/", "true").CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
}
