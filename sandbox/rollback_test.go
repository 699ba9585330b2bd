package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/sandbox"
	"tine/sandbox/ns"
)

// TestRollbackCrashRecovery: a rollback cut short by a crash is undone
// when the snapshot's OS layer was not yet wholly copied, and finished
// when it was: the OS layer and the project then both hold the snapshot's
// files, or both what they held before, never one without the other. A
// sandbox whose rollback did not finish does not start.
func TestRollbackCrashRecovery(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("r", sandbox.Limits{})
	write := func(v string) {
		e.mustSh("r", fmt.Sprintf("echo %s > %s/f; echo %s > /etc/tine-rb", v, e.project, v))
	}
	write("one")
	s, err := e.m.Snapshot(ctx, "r", sandbox.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	write("two")
	dir := filepath.Join(e.root, "sandboxes", "r")
	snapLayer := filepath.Join(e.root, "snapshots", s.ID, "runtime")
	copyLayer := func(to string) {
		t.Helper()
		if out, err := exec.Command("cp", "-a", snapLayer, to).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	mark := func() {
		t.Helper()
		b, _ := json.Marshal(map[string]string{"snapshot": s.ID, "fs": s.FS})
		if err := os.WriteFile(filepath.Join(dir, "rollback.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// crash closes the manager, lets prepare leave what a crash would,
	// opens a new manager, and returns what it recovered and what the
	// sandbox then holds.
	crash := func(prepare func()) (string, string) {
		t.Helper()
		if err := e.m.Close(ctx); err != nil {
			t.Fatal(err)
		}
		prepare()
		rt, err := ns.New(agentPath)
		if err != nil {
			t.Fatal(err)
		}
		if e.m, err = sandbox.Open(ctx, e.root, e.fs, sandbox.Options{Runtime: rt}); err != nil {
			t.Fatal(err)
		}
		if err := e.m.Start(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"rollback.json", "runtime.old", ".tmp-runtime"} {
			if _, err := os.Lstat(filepath.Join(dir, p)); err == nil {
				t.Errorf("%s left after recovery", p)
			}
		}
		return strings.Join(e.m.Recovered(), "\n"), e.mustSh("r", fmt.Sprintf("cat %s/f /etc/tine-rb", e.project))
	}

	rt := filepath.Join(dir, "runtime")
	old := filepath.Join(dir, "runtime.old")
	moveAside := func() {
		t.Helper()
		if err := os.Rename(rt, old); err != nil {
			t.Fatal(err)
		}
	}
	// Marked, the layer not yet moved aside: undone.
	rec, got := crash(mark)
	if got != "two\ntwo\n" || !strings.Contains(rec, "it was undone") {
		t.Fatalf("rollback cut short after rollback.json: files %q, recovered %q", got, rec)
	}
	// Moved aside, the snapshot's layer half copied: undone.
	rec, got = crash(func() {
		mark()
		moveAside()
		copyLayer(filepath.Join(dir, ".tmp-runtime"))
	})
	if got != "two\ntwo\n" || !strings.Contains(rec, "it was undone") {
		t.Fatalf("rollback cut short in the copy: files %q, recovered %q", got, rec)
	}
	// Copied, the project not yet rolled back: finished.
	rec, got = crash(func() {
		mark()
		moveAside()
		copyLayer(rt)
	})
	if got != "one\none\n" || !strings.Contains(rec, "finished its rollback to "+s.ID) {
		t.Fatalf("rollback cut short before the project's: files %q, recovered %q", got, rec)
	}
	// Done but for the old layer's removal: it is removed.
	write("three")
	rec, got = crash(func() {
		if err := os.MkdirAll(old, 0o700); err != nil {
			t.Fatal(err)
		}
	})
	if got != "three\nthree\n" || !strings.Contains(rec, "removed the old OS layer") {
		t.Fatalf("rollback cut short in its cleanup: files %q, recovered %q", got, rec)
	}
	// A sandbox whose rollback did not finish does not start.
	if err := e.m.Stop(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	mark()
	if err := e.m.Start(ctx, "r"); err == nil || !strings.Contains(err.Error(), "rollback of it did not finish") {
		t.Fatalf("start with rollback.json: %v", err)
	}
	os.Remove(filepath.Join(dir, "rollback.json"))
	if err := e.m.Start(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	// A finished rollback leaves nothing that a later restart would
	// roll back again.
	write("four")
	if err := e.m.Rollback(ctx, "r", s.ID); err != nil {
		t.Fatal(err)
	}
	write("five")
	rec, got = crash(func() {})
	if got != "five\nfive\n" || rec != "" {
		t.Fatalf("restart after a rollback and writes: files %q, recovered %q", got, rec)
	}
}
