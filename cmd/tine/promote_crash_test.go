package main

import (
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPromoteDaemonCrash kills a real `tine serve` daemon with SIGKILL
// in the middle of a promotion it is applying (after its journal is
// written, at a random point of the writes), then shows that `tine
// promote --resume` through the CLI (which starts a new daemon) leaves
// exactly the merged tree, and `tine promote --abort` exactly the tree
// before, with no temporary entry left and the journal gone.
func TestPromoteDaemonCrash(t *testing.T) {
	c, base := daemonCLI(t)
	const files = 1500
	rounds := []string{"resume", "abort", "resume", "abort"}
	if testing.Short() {
		rounds = rounds[:2]
	}
	hits := 0
	for r, way := range rounds {
		proj := filepath.Join(base, fmt.Sprintf("proj%d", r))
		os.MkdirAll(proj, 0o755)
		before := map[string]string{}
		for i := range files {
			p := fmt.Sprintf("f%04d", i)
			before[p] = fmt.Sprintf("host %d\n", i)
			os.WriteFile(filepath.Join(proj, p), []byte(before[p]), 0o644)
		}
		sb := fmt.Sprintf("c%d", r)
		c.ok("create", "--from", proj, "--name", sb)
		// The sandbox edits every file, removes one in ten and adds 300.
		c.ok("exec", "--cwd", proj, sb, "--", "sh", "-c",
			`for f in f*; do echo sb >> $f; done; rm f*0; i=0; while [ $i -lt 300 ]; do echo new > n$i; i=$((i+1)); done`)
		after := map[string]string{}
		for p, v := range before {
			if !strings.HasSuffix(p, "0") {
				after[p] = v + "sb\n"
			}
		}
		for i := range 300 {
			after[fmt.Sprintf("n%d", i)] = "new\n"
		}
		// The host moves too: one file of its own, kept either way.
		os.WriteFile(filepath.Join(proj, "host.txt"), []byte("mine\n"), 0o644)
		before["host.txt"], after["host.txt"] = "mine\n", "mine\n"

		journal := filepath.Join(c.root, "promote", sb+".json")
		daemon := c.daemonPID()
		cmd := exec.Command(tineBin, "--root", c.root, "promote", sb)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Millisecond) {
			if _, err := os.Stat(journal); err == nil {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("round %d: no journal within a minute", r)
			}
		}
		time.Sleep(time.Duration(rand.Intn(300)) * time.Millisecond)
		if err := syscall.Kill(daemon, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		for syscall.Kill(daemon, 0) == nil {
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := os.Stat(journal); err != nil {
			// The apply finished before the kill landed.
			t.Logf("round %d: the promotion completed before the kill", r)
			compareTree(t, proj, after)
			continue
		}
		hits++
		// A new promotion is refused while the journal stands (this
		// starts a new daemon).
		if _, errOut, code := c.run("", "promote", sb); code == 0 || !strings.Contains(errOut, "--resume") {
			t.Fatalf("round %d: promotion over a journal: exit %d %s", r, code, errOut)
		}
		out := c.ok("promote", sb, "--"+way)
		want := after
		if way == "abort" {
			want = before
		}
		compareTree(t, proj, want)
		if _, err := os.Stat(journal); !os.IsNotExist(err) {
			t.Fatalf("round %d: journal left after --%s: %v\n%s", r, way, err, out)
		}
	}
	if hits == 0 {
		t.Fatal("no round killed the daemon mid-apply; the test proved nothing")
	}
}

// compareTree checks that dir holds exactly the files of want, with
// their contents, and nothing else (no temporary entry).
func compareTree(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !d.Type().IsRegular() {
			t.Errorf("%s: not a regular file (%v)", rel, d.Type())
			return nil
		}
		b, _ := os.ReadFile(p)
		got[rel] = string(b)
		return nil
	})
	for p, v := range want {
		if got[p] != v {
			t.Fatalf("%s: %q, want %q", p, got[p], v)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Fatalf("%s: not expected (a temporary entry left?)", p)
		}
	}
}
