package ns

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"tine/guestagent/client"
	"tine/sandbox"
)

// TestSharedLayers: binds of one seed at once make one shared layer,
// each state directory linking its ref and pointing its stacked layer at
// it; a sweep keeps a layer while a state directory or a bind under way
// refers to it, and removes it, and what a make cut short left, after.
func TestSharedLayers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: linkLayers reads the host root through a cloned mount")
	}
	root := t.TempDir()
	seed := filepath.Join(root, "snap", "runtime")
	if err := os.MkdirAll(filepath.Join(seed, upperDir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seed, upperDir, "etc", "tine-f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	// What a make cut short leaves, and a layer no one refers to.
	for _, d := range []string{".tmp-cut", filepath.Join("orphan", "layer")} {
		if err := os.MkdirAll(filepath.Join(root, "layers", d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "layers", "orphan", "ref"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := newSharedLayers(filepath.Join(root, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		t.Helper()
		ents, err := os.ReadDir(s.dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	if got := names(); len(got) != 0 {
		t.Fatalf("a new runtime's sweep left %v", got)
	}
	const n = 6
	dirs := make([]string, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range dirs {
		dirs[i] = filepath.Join(root, "sandboxes", fmt.Sprint(i), "runtime")
		if err := os.MkdirAll(dirs[i], 0o700); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := s.use(context.Background(), seed, dirs[i], forkLower)
			if err == nil && !ok {
				err = fmt.Errorf("not shared")
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("bind %d: %v", i, err)
		}
	}
	got := names()
	if len(got) != 1 {
		t.Fatalf("%d binds of one seed at once made layers %v, want one", n, got)
	}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, forkLower, "etc", "tine-f"))
		if err != nil || string(b) != "f" {
			t.Fatalf("%s's stacked layer reads %q, %v", d, b, err)
		}
	}
	links := func() uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(s.dir, got[0], "ref"), &st); err != nil {
			t.Fatal(err)
		}
		return uint64(st.Nlink)
	}
	if l := links(); l != n+1 {
		t.Errorf("ref has %d links, want %d", l, n+1)
	}
	// A bind under way (its reference not made yet) keeps a layer no
	// state directory refers to.
	for _, d := range dirs {
		os.RemoveAll(d)
	}
	s.mu.Lock()
	s.bySeed[seed].users++
	s.mu.Unlock()
	if err := s.sweep(); err != nil {
		t.Fatal(err)
	}
	if len(names()) != 1 {
		t.Fatal("a sweep removed the layer a bind was about to link")
	}
	s.mu.Lock()
	s.bySeed[seed].users--
	s.mu.Unlock()
	if err := s.sweep(); err != nil {
		t.Fatal(err)
	}
	if got := names(); len(got) != 0 {
		t.Fatalf("layers no one refers to are left: %v", got)
	}
	// The seed's next bind makes its layer again.
	if err := os.MkdirAll(dirs[0], 0o700); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.use(context.Background(), seed, dirs[0], forkLower); !ok || err != nil {
		t.Fatalf("a bind after the sweep: %v, %v", ok, err)
	}
	if got := names(); len(got) != 1 {
		t.Fatalf("a bind after the sweep: layers %v, want one", got)
	}
}

// TestWarmForksShareLayer: forks bound from warm sandboxes, in a user
// namespace and without, stack the one layer their seed's forks share:
// each sees the seed's files and deletions, a change is its own, and so
// it stays when it starts again, cold, over its state. The last case
// makes the layers durable with its fsync walk rather than syncfs, as on
// a host with much dirty (syncTree).
func TestWarmForksShareLayer(t *testing.T) {
	for _, c := range []struct {
		name          string
		userns, fsync bool
	}{{"userns", true, false}, {"no-userns", false, false}, {"no-userns-fsync", false, true}} {
		userns := c.userns
		t.Run(c.name, func(t *testing.T) {
			if c.fsync {
				forceFsync(t)
			}
			rt, dir, proj, seed := seedFixture(t, userns)
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			w, err := rt.Warm(ctx, sandbox.WarmOptions{Dir: filepath.Join(dir, "warm"), N: 1, Layers: filepath.Join(dir, "layers")})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			const view = "; test -e /etc/os-release && echo os-release; cat /etc/seeded"
			runIn := func(in sandbox.Instance, script string) string {
				t.Helper()
				c, err := client.Dial(ctx, in.AgentSocket())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				out, code := run(t, c, "sh", "-c", script+view)
				if code != 0 {
					t.Fatalf("%s: exit %d: %q", script, code, out)
				}
				return out
			}
			var links []string
			for _, name := range []string{"f1", "f2"} {
				if err := rt.WaitWarm(ctx, 1); err != nil {
					t.Fatal(err)
				}
				spec := sandbox.Spec{ID: "nsshared-" + name, Hostname: name, Dir: filepath.Join(dir, name),
					ProjectPath: "/srv/proj-nsshared", ProjectSource: proj, Seed: seed}
				in, err := rt.Start(ctx, spec)
				if err != nil {
					t.Fatal(err)
				}
				if got := runIn(in, "echo "+name+" >> /etc/seeded"); got != "S"+name+"\n" {
					in.Stop(ctx)
					t.Fatalf("fork %s sees %q, want the seed's files and deletion and its own change", name, got)
				}
				if err := in.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				l, err := os.Readlink(filepath.Join(spec.Dir, lowerDir))
				if err != nil {
					t.Fatalf("fork %s's stacked layer is not a shared one: %v", name, err)
				}
				links = append(links, filepath.Base(filepath.Dir(l)))
				spec.Seed = ""
				if in, err = rt.Start(ctx, spec); err != nil {
					t.Fatal(err)
				}
				got := runIn(in, "true")
				in.Stop(ctx)
				if got != "S"+name+"\n" {
					t.Fatalf("fork %s started again over its state sees %q", name, got)
				}
			}
			if rt.WarmBound() != 2 {
				t.Errorf("%d of the 2 forks were bound from warm sandboxes", rt.WarmBound())
			}
			if links[0] != links[1] {
				t.Errorf("the forks stack layers %v, want one", links)
			}
		})
	}
}
