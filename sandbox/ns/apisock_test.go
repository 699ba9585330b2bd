package ns

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tine/guestagent/client"
	"tine/sandbox"
)

// apiServer serves "hello NAME" on a Unix socket at path.
func apiServer(t *testing.T, path, name string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o666)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("hello " + name))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func dialAgent(t *testing.T, in sandbox.Instance) *client.Client {
	t.Helper()
	ctx := context.Background()
	for i := 0; ; i++ {
		c, err := client.Dial(ctx, in.AgentSocket())
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		if i > 2000 {
			t.Fatal(err, in.(*instance).log.String())
		}
		time.Sleep(time.Millisecond)
	}
}

// checkAPISocket: the socket answers inside at /run/tine/api.sock, and
// the sandbox can neither remove, move nor unmount it.
func checkAPISocket(t *testing.T, c *client.Client, want string) {
	t.Helper()
	out, code := run(t, c, "sh", "-c", `curl -sS --unix-socket /run/tine/api.sock http://x/; echo
for c in "rm -f /run/tine/api.sock" "mv /run/tine/api.sock /tmp/x" "umount /run/tine/api.sock" "chmod 000 /run/tine/api.sock"; do
	if $c 2>/dev/null; then echo "ALLOWED: $c"; fi
done
curl -sS --unix-socket /run/tine/api.sock http://x/`)
	if code != 0 || strings.Count(out, want) != 2 || strings.Contains(out, "ALLOWED") {
		t.Fatalf("exit %d: %s", code, out)
	}
}

// TestAPISocketBound: a cold start and a warm one (a fresh sandbox and a
// fork) each get their own socket at /run/tine/api.sock.
func TestAPISocketBound(t *testing.T) {
	rt, err := New(buildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	proj := filepath.Join(dir, "proj")
	os.Mkdir(proj, 0o755)
	ctx := context.Background()
	sock := filepath.Join(dir, "a.sock")
	apiServer(t, sock, "a")
	in, err := rt.Start(ctx, sandbox.Spec{ID: "apisock-a", Hostname: "a", Dir: filepath.Join(dir, "rt-a"),
		ProjectPath: "/work/proj-apisock", ProjectSource: proj, APISocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop(ctx)
	checkAPISocket(t, dialAgent(t, in), "hello a")

	// Warm: a fresh sandbox, then a fork seeded from a's state.
	wc, err := rt.Warm(ctx, sandbox.WarmOptions{Dir: filepath.Join(dir, "warm"), N: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	for _, name := range []string{"b", "c"} {
		sock := filepath.Join(dir, name+".sock")
		apiServer(t, sock, name)
		spec := sandbox.Spec{ID: "apisock-" + name, Hostname: name, Dir: filepath.Join(dir, "rt-"+name),
			ProjectPath: "/work/proj-apisock", ProjectSource: proj, APISocket: sock}
		if name == "c" {
			in.Freeze(ctx)
			spec.Seed = filepath.Join(dir, "rt-a")
		}
		var w sandbox.Instance
		for i := 0; ; i++ {
			// Wait for a warm one, so that this is a bind, not a cold start.
			if rt.WarmReady() > 0 || i > 3000 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if w, err = rt.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if name == "c" {
			in.Thaw(ctx)
		}
		defer w.Stop(ctx)
		checkAPISocket(t, dialAgent(t, w), "hello "+name)
	}
	if n := rt.WarmBound(); n != 2 {
		t.Errorf("%d of the 2 sandboxes were warm ones", n)
	}
}
