package ns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/guestagent/client"
	"tine/internal/nsinit"
	"tine/sandbox"
)

// TestWarmBind binds a warm instance to a sandbox, with a user namespace
// and without: the project, the host name, the hidden path (owned by the
// sandbox's root), the renamed cgroup and its pids limit are the
// sandbox's; no process but the agent and the command runs in it, and
// every one has the reduced capabilities.
func TestWarmBind(t *testing.T) {
	for _, userns := range []bool{true, false} {
		t.Run(map[bool]string{true: "userns", false: "no-userns"}[userns], func(t *testing.T) { testWarmBind(t, userns) })
	}
}

func testWarmBind(t *testing.T, userns bool) {
	rt, dir, ctx := warmRuntime(t, userns, 60*time.Second)
	if _, err := rt.usernsSetup(); userns && err != nil {
		t.Fatalf("this host runs sandboxes in user namespaces; here it cannot: %v", err)
	}
	if err := rt.WaitWarm(ctx, 1); err != nil {
		t.Fatal(err)
	}
	proj := filepath.Join(dir, "proj")
	os.Mkdir(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "a"), []byte("A"), 0o644)
	hidden := "/var/tmp/tine-warm-hidden-" + filepath.Base(dir)
	os.MkdirAll(hidden, 0o700)
	os.WriteFile(filepath.Join(hidden, "secret"), []byte("x"), 0o600)
	defer os.RemoveAll(hidden)
	in, err := rt.Start(ctx, sandbox.Spec{ID: "nswarm", Hostname: "warmhost", Dir: filepath.Join(dir, "rt"),
		ProjectPath: "/srv/proj-nswarm", ProjectSource: proj, Hide: []string{hidden},
		Limits: sandbox.Limits{Pids: 77}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop(context.Background())
	// The host bound it from a thread of this process, which went back:
	// a thread left in the sandbox's namespaces would keep its mounts
	// (the project's FUSE mount among them) after the sandbox ends.
	for _, n := range []string{"mnt", "uts"} {
		if err := sameNamespace(n); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "rt", upperDir)); err != nil {
		t.Fatalf("the warm instance's state was not moved into place: %v", err)
	}
	c, err := client.Dial(ctx, in.AgentSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out, code := run(t, c, "sh", "-c", "cat /srv/proj-nswarm/a; echo; hostname; ls "+hidden+" 2>&1 | wc -l; "+
		"ps -e -o stat= > /tmp/ps.out; grep -vc '^Z' /tmp/ps.out; stat -c '%u:%g %a' "+hidden+"; grep -h CapEff /proc/[0-9]*/status | sort -u")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 6 || lines[0] != "A" || lines[1] != "warmhost" || strings.TrimSpace(lines[2]) != "0" {
		t.Fatalf("inside the warm sandbox: %q", out)
	}
	// agent, sh, ps: nothing else (a zombie has ended). ps writes a file
	// first: in a pipeline, grep may not have started when ps reads /proc.
	if n := strings.TrimSpace(lines[3]); n != "3" {
		t.Errorf("%s processes, want 3 (nothing but the agent, sh and ps): %q", n, out)
	}
	if lines[4] != "0:0 0" {
		t.Errorf("the hidden path's cover is %q inside, want owner 0:0 and mode 0", lines[4])
	}
	for _, l := range lines[5:] {
		if !strings.HasPrefix(l, "CapEff:") || strings.HasSuffix(l, "1ffffffffff") || strings.HasSuffix(l, "3ffffffffff") {
			t.Errorf("a process with every capability: %q", l)
		}
	}
	b, err := os.ReadFile("/sys/fs/cgroup/pids/tine/nswarm/pids.max")
	if err != nil || strings.TrimSpace(string(b)) != "77" {
		t.Errorf("pids.max of the renamed group: %q, %v", b, err)
	}
	// A seeded start (a fork) takes a warm instance too: its root is
	// rebuilt with the seed's layer stacked, with the same project,
	// hidden paths and host name rules, and nothing else running.
	if err := rt.WaitWarm(ctx, 1); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "seed")
	os.MkdirAll(filepath.Join(seed, upperDir, "etc"), 0o755)
	os.WriteFile(filepath.Join(seed, upperDir, "etc", "warm-seeded"), []byte("S"), 0o644)
	if err := unix.Mknod(filepath.Join(seed, upperDir, "etc", "os-release"), unix.S_IFCHR, 0); err != nil { // deleted in the seed
		t.Fatal(err)
	}
	in2, err := rt.Start(ctx, sandbox.Spec{ID: "nswarm2", Hostname: "h2", Dir: filepath.Join(dir, "rt2"),
		ProjectPath: "/srv/proj-nswarm", ProjectSource: proj, Hide: []string{hidden}, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	defer in2.Stop(context.Background())
	if rt.WarmBound() != 2 {
		t.Errorf("%d warm instances bound, want 2: a seeded start takes one too", rt.WarmBound())
	}
	c2, err := client.Dial(ctx, in2.AgentSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	out, code = run(t, c2, "sh", "-c", "cat /etc/warm-seeded; echo; cat /srv/proj-nswarm/a; echo; hostname; ls "+hidden+
		" 2>&1 | wc -l; ps -e -o stat= > /tmp/ps.out; grep -vc '^Z' /tmp/ps.out; echo F > /etc/fork-wrote; grep -h CapEff /proc/[0-9]*/status | sort -u")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) < 6 || lines[0] != "S" || lines[1] != "A" || lines[2] != "h2" || strings.TrimSpace(lines[3]) != "0" {
		t.Fatalf("inside the warm fork: exit %d: %q", code, out)
	}
	if n := strings.TrimSpace(lines[4]); n != "3" {
		t.Errorf("%s processes in the warm fork, want 3 (nothing but the agent, sh and ps): %q", n, out)
	}
	for _, l := range lines[5:] {
		if !strings.HasPrefix(l, "CapEff:") || strings.HasSuffix(l, "1ffffffffff") || strings.HasSuffix(l, "3ffffffffff") {
			t.Errorf("a process with every capability in the warm fork: %q", l)
		}
	}
	// The fork's writes land in its own layer, under the usual name; the
	// seed is untouched; the agent's file transfers see the new root.
	if b, err := os.ReadFile(filepath.Join(dir, "rt2", upperDir, "etc", "fork-wrote")); err != nil || string(b) != "F\n" {
		t.Errorf("the fork's write in its layer: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(seed, upperDir, "etc", "fork-wrote")); err == nil {
		t.Error("the fork wrote into the seed's layer")
	}
	for _, n := range []string{forkUpper, forkLower, forkWork, upperDir + ".warm", workDir + ".warm"} {
		if _, err := os.Lstat(filepath.Join(dir, "rt2", n)); err == nil {
			t.Errorf("%s left in the fork's state", n)
		}
	}
	var got bytes.Buffer
	if _, err := c2.GetFile(ctx, "/etc/warm-seeded", &got); err != nil || got.String() != "S" {
		t.Errorf("GetFile in the warm fork: %q, %v", got.String(), err)
	}
	// The seed's layer is stacked, its files shared: what the seed
	// deleted stays deleted, and a change to a seeded file is the fork's
	// alone.
	out, code = run(t, c2, "sh", "-c", "ls /etc/os-release 2>&1 >/dev/null | wc -l; echo X >> /etc/warm-seeded; cat /etc/warm-seeded")
	if code != 0 || out != "1\nSX\n" {
		t.Errorf("the seed's deletion and a change to its file, inside the fork: exit %d: %q", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(seed, upperDir, "etc", "warm-seeded")); err != nil || string(b) != "S" {
		t.Errorf("the seed's file after the fork changed its own: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "rt2", lowerDir, "etc", "warm-seeded")); err != nil {
		t.Errorf("the fork has no stacked layer: %v", err)
	}
}

// sameNamespace checks that every thread of this process is in its
// namespace of kind n ("mnt", "uts").
func sameNamespace(n string) error {
	want, err := os.Readlink("/proc/self/ns/" + n)
	if err != nil {
		return err
	}
	tasks, err := filepath.Glob("/proc/self/task/*/ns/" + n)
	if err != nil {
		return err
	}
	for _, p := range tasks {
		if got, err := os.Readlink(p); err == nil && got != want {
			return fmt.Errorf("thread %s is in %s, not this process's %s", strings.Split(p, "/")[4], got, want)
		}
	}
	return nil
}

// TestWarmForkHostileSeed binds warm forks whose seed layer (written by
// the sandbox forked, so hostile) turns the mount points the bind uses
// into symlinks to host paths: /proc, /run, and the project path's
// parent. Each bind fails with the symlink refused; nothing is written or
// mounted at the links' target, and the binding thread is back in this
// process's namespaces.
func TestWarmForkHostileSeed(t *testing.T) {
	rt, dir, ctx := warmRuntime(t, true, 90*time.Second)
	proj := filepath.Join(dir, "proj")
	os.Mkdir(proj, 0o755)
	target := filepath.Join(dir, "target") // where a followed link would land
	os.Mkdir(target, 0o755)
	for i, link := range []string{"proc", "run", "srv"} {
		seed := filepath.Join(dir, fmt.Sprintf("seed%d", i))
		os.MkdirAll(filepath.Join(seed, upperDir), 0o755)
		if err := os.Symlink(target, filepath.Join(seed, upperDir, link)); err != nil {
			t.Fatal(err)
		}
		if err := rt.WaitWarm(ctx, 1); err != nil {
			t.Fatal(err)
		}
		in, err := rt.Start(ctx, sandbox.Spec{ID: fmt.Sprintf("nshostile%d", i), Hostname: "h", Dir: filepath.Join(dir, fmt.Sprintf("rt%d", i)),
			ProjectPath: "/srv/proj-hostile", ProjectSource: proj, Seed: seed})
		if err == nil {
			in.Stop(context.Background())
			t.Errorf("a fork whose seed has /%s -> %s started", link, target)
		} else if !errors.Is(err, nsinit.ErrSymlink) {
			t.Errorf("fork with /%s a symlink: %v, want a refused symlink", link, err)
		}
		if ents, _ := os.ReadDir(target); len(ents) != 0 {
			t.Errorf("fork with /%s a symlink wrote %d entries into %s", link, len(ents), target)
		}
		// (Other packages' tests mount and unmount beside this one: only
		// mounts at the link's target would be this bind's.)
		mi, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(l); len(f) > 4 && (f[4] == target || strings.HasPrefix(f[4], target+"/")) {
				t.Errorf("fork with /%s a symlink mounted on the host: %s", link, l)
			}
		}
		for _, n := range []string{"mnt", "uts"} {
			if err := sameNamespace(n); err != nil {
				t.Error(err)
			}
		}
	}
}

// warmRuntime returns a runtime (with a user namespace or without) that
// keeps one warm instance, a test directory and a context ending after
// limit, all ended with the test.
func warmRuntime(t *testing.T, userns bool, limit time.Duration) (*Runtime, string, context.Context) {
	t.Helper()
	rt, err := New(buildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	rt.UseUserns(userns)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	w, err := rt.Warm(ctx, sandbox.WarmOptions{Dir: filepath.Join(dir, "warm"), N: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return rt, dir, ctx
}

// TestFinishForkLayer: a start finds the state a crash leaves in the
// middle of a warm fork's layer swap and completes it: the fork's layers,
// not the warm root's, become the sandbox's. A bind cut before the
// stacked layer had its name leaves the warm root's layer alone.
func TestFinishForkLayer(t *testing.T) {
	for _, cut := range []string{"before the stacked layer's name", "before the swap", "before the swap, shared", "between its renames", "before the stacked layer's rename"} {
		t.Run(cut, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "runtime")
			mk := func(p, content string) {
				t.Helper()
				if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, p), []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			own, stacked := "fork", "stacked"
			switch cut {
			case "before the stacked layer's name":
				mk(filepath.Join(upperDir, "etc", "f"), "warm")
				mk(filepath.Join(forkUpper, "etc", "f"), "fork")
				mk(filepath.Join(".tmp-"+forkLower, "etc", "g"), "half")
				mk(forkRef, "") // a shared layer's reference, made before its symlink
				own, stacked = "warm", ""
			case "before the swap":
				mk(filepath.Join(upperDir, "etc", "warm"), "")
				mk(filepath.Join(forkUpper, "etc", "f"), "fork")
				mk(filepath.Join(forkLower, "etc", "g"), "stacked")
			case "before the swap, shared":
				mk(filepath.Join(upperDir, "etc", "warm"), "")
				mk(filepath.Join(forkUpper, "etc", "f"), "fork")
				mk(filepath.Join("..", "layers", "x", "layer", "etc", "g"), "stacked")
				mk(forkRef, "")
				if err := os.Symlink(filepath.Join("..", "layers", "x", "layer"), filepath.Join(dir, forkLower)); err != nil {
					t.Fatal(err)
				}
			case "between its renames":
				mk(filepath.Join(upperDir+".warm", "etc", "warm"), "")
				mk(filepath.Join(forkUpper, "etc", "f"), "fork")
				mk(filepath.Join(forkLower, "etc", "g"), "stacked")
			default:
				mk(filepath.Join(upperDir, "etc", "f"), "fork")
				mk(filepath.Join(forkLower, "etc", "g"), "stacked")
			}
			mk(filepath.Join(forkWork, "x"), "")
			check := func() {
				t.Helper()
				if b, err := os.ReadFile(filepath.Join(dir, upperDir, "etc", "f")); err != nil || string(b) != own {
					t.Fatalf("the sandbox's own layer after the swap was finished: %q, %v, want %q", b, err, own)
				}
				b, err := os.ReadFile(filepath.Join(dir, lowerDir, "etc", "g"))
				if stacked == "" && !errors.Is(err, os.ErrNotExist) || stacked != "" && string(b) != stacked {
					t.Fatalf("the stacked layer after the swap was finished: %q, %v, want %q", b, err, stacked)
				}
				for _, n := range []string{forkUpper, forkLower, forkWork, upperDir + ".warm", ".tmp-" + forkLower, filepath.Join(upperDir, "etc", "warm")} {
					if _, err := os.Lstat(filepath.Join(dir, n)); err == nil {
						t.Errorf("%s left", n)
					}
				}
				_, err = os.Lstat(filepath.Join(dir, forkRef))
				if shared := strings.HasSuffix(cut, "shared"); shared && err != nil {
					t.Errorf("the shared layer's reference: %v", err)
				} else if stacked == "" && err == nil {
					t.Error("the reference of a shared layer the bind did not get to stack is left")
				}
			}
			if err := finishForkLayer(dir); err != nil {
				t.Fatal(err)
			}
			check()
			// Done again, it changes nothing.
			if err := finishForkLayer(dir); err != nil {
				t.Fatal(err)
			}
			check()
		})
	}
}
