package ns

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/sandbox"
)

func TestMain(m *testing.M) {
	Init()
	os.Exit(m.Run())
}

// buildAgent builds cmd/tine-agent statically into a temporary directory.
func buildAgent(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tine-agent")
	cmd := exec.Command("go", "build", "-o", bin, "tine/cmd/tine-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v\n%s", err, out)
	}
	return bin
}

// run executes argv in the sandbox and returns its output and exit code.
func run(t *testing.T, c *client.Client, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: argv, Env: []string{"PATH=" + DefaultPath}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&out, p.Stderr); close(done) }()
	var o bytes.Buffer
	io.Copy(&o, p.Stdout)
	<-done
	ex, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return o.String() + out.String(), ex.Code
}

// TestStartPlainDir runs a sandbox over a plain project directory: the
// agent answers, the project is at its path, writes elsewhere stay in the
// layer, and Stop removes the cgroups.
func TestStartPlainDir(t *testing.T) {
	rt, err := New(buildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	proj := filepath.Join(dir, "proj")
	os.Mkdir(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "a"), []byte("A"), 0o644)
	ctx := context.Background()
	in, err := rt.Start(ctx, sandbox.Spec{ID: "nstest", Hostname: "nstest", Dir: filepath.Join(dir, "rt"),
		ProjectPath: "/work/proj-nstest", ProjectSource: proj, Limits: sandbox.Limits{Pids: 64}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop(ctx)
	var c *client.Client
	for i := 0; ; i++ {
		c, err = client.Dial(ctx, in.AgentSocket())
		if err == nil {
			break
		}
		if i > 200 {
			t.Fatal(err, in.(*instance).log.String())
		}
		time.Sleep(time.Millisecond)
	}
	defer c.Close()
	if out, code := run(t, c, "sh", "-c", "cat /work/proj-nstest/a; echo x > /etc/nstest-x; hostname; cat /proc/1/cmdline | tr '\\0' ' '"); code != 0 || out == "" {
		t.Fatalf("exit %d: %s", code, out)
	} else {
		t.Log(out)
	}
	if _, err := os.Stat("/etc/nstest-x"); err == nil {
		os.Remove("/etc/nstest-x")
		t.Fatal("a write to /etc in the sandbox reached the host")
	}
}
