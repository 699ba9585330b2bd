package spec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"tine/api"
	"tine/api/client"
	"tine/cowfs"
	"tine/guestagent/proto"
	"tine/internal/testagent"
	"tine/internal/testimage"
	"tine/oci"
	"tine/sandbox"
	"tine/sandbox/ns"
)

var agentPath string

func TestMain(m *testing.M) {
	testagent.Main(m, &agentPath)
}

// daemon serves a manager over a fresh store and returns its client.
func daemon(t *testing.T) *client.Client {
	base := t.TempDir()
	fs, err := cowfs.Open(filepath.Join(base, "cowfs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := ns.New(agentPath)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "state")
	m, err := sandbox.Open(context.Background(), root, fs, sandbox.Options{Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := api.Listen(root, "")
	if err != nil {
		t.Fatal(err)
	}
	images, err := oci.Open(filepath.Join(root, "images"), oci.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewServer(m, api.ServerOptions{Images: images})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
		m.Close(context.Background())
		fs.Close()
	})
	return client.New(filepath.Join(root, api.SocketName))
}

func cat(t *testing.T, c *client.Client, sb *api.Sandbox, file string) string {
	t.Helper()
	var out bytes.Buffer
	ex, err := c.Exec(t.Context(), sb.Name, api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"cat", filepath.Join(sb.ProjectPath, file)}}}, client.ExecIO{Stdout: &out})
	if err != nil || ex.Code != 0 {
		t.Fatalf("cat %s in %s: %v %+v", file, sb.Name, err, ex)
	}
	return out.String()
}

// TestBuildCache: setup steps run once; the same spec over the same files
// starts from the cached snapshot; a changed step runs again from that
// step on; changed files run everything.
func TestBuildCache(t *testing.T) {
	c := daemon(t)
	proj := filepath.Join(t.TempDir(), "proj")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "in.txt"), []byte("one\n"), 0o644)
	b := &Builder{Client: c, Cache: Cache{Dir: filepath.Join(t.TempDir(), "cache")}}
	spec := func(step2 string) *Spec {
		s, err := Parse([]byte(fmt.Sprintf("env: {WHO: spec}\nsetup:\n  - cat in.txt > s1; date +%%s%%N >> s1; echo $WHO >> s1\n  - %s\nservices:\n  - sleep 1000\n", step2)))
		if err != nil {
			t.Fatal(err)
		}
		s.Base.Dir = proj
		return s
	}
	build := func(s *Spec, wantCached, wantRan int) (*api.Sandbox, time.Duration) {
		t.Helper()
		start := time.Now()
		r, err := b.Build(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if r.Cached != wantCached || r.Ran != wantRan {
			t.Fatalf("cached %d ran %d, want %d and %d", r.Cached, r.Ran, wantCached, wantRan)
		}
		return r.Sandbox, took
	}
	first, cold := build(spec("date +%s%N > s2"), 0, 2)
	s1, s2 := cat(t, c, first, "s1"), cat(t, c, first, "s2")
	if !strings.HasPrefix(s1, "one\n") || !strings.HasSuffix(s1, "spec\n") {
		t.Errorf("s1 %q", s1)
	}
	st, err := c.Get(t.Context(), first.Name)
	if err != nil || len(st.Services) != 1 {
		t.Errorf("services of the built sandbox: %+v %v", st, err)
	}

	again, warm := build(spec("date +%s%N > s2"), 2, 0)
	if cat(t, c, again, "s1") != s1 || cat(t, c, again, "s2") != s2 {
		t.Errorf("a cached build ran a step again")
	}
	t.Logf("create with 2 setup steps: %v cold, %v from the cache", cold, warm)

	changed, _ := build(spec("date +%s%N > s2; echo changed >> s2"), 1, 1)
	if cat(t, c, changed, "s1") != s1 {
		t.Errorf("step 1 ran again although only step 2 changed")
	}
	if got := cat(t, c, changed, "s2"); got == s2 || !strings.HasSuffix(got, "changed\n") {
		t.Errorf("step 2 was not run again: %q", got)
	}

	os.WriteFile(filepath.Join(proj, "in.txt"), []byte("two\n"), 0o644)
	other, _ := build(spec("date +%s%N > s2"), 0, 2)
	if got := cat(t, c, other, "s1"); !strings.HasPrefix(got, "two\n") {
		t.Errorf("changed base: s1 %q", got)
	}

	// A failing step names itself; the ones before it stay cached.
	bad := spec("exit 7")
	if _, err := b.Build(t.Context(), bad); err == nil || !strings.Contains(err.Error(), "setup step 2") || !strings.Contains(err.Error(), "exited with 7") {
		t.Errorf("failing step: %v", err)
	}
	// Builders do not stay behind.
	list, _ := c.List(t.Context())
	if len(list) != 4 {
		var names []string
		for _, s := range list {
			names = append(names, s.Name)
		}
		t.Errorf("sandboxes left: %v, want the 4 built", names)
	}
}

// TestBuildOverImage: a spec over an image runs its setup there, the
// result keeps the image, and the cache keys on the image's digest: a new
// image under the same name runs setup again.
func TestBuildOverImage(t *testing.T) {
	c := daemon(t)
	proj := filepath.Join(t.TempDir(), "proj")
	os.MkdirAll(proj, 0o755)
	tb := filepath.Join(t.TempDir(), "bb.tar")
	testimage.WriteTarball(t, tb, "example.test/bb:1", testimage.BusyboxImage(t))
	if _, err := c.ImportImage(t.Context(), api.ImportRequest{Path: tb, Name: "bb"}); err != nil {
		t.Fatal(err)
	}
	b := &Builder{Client: c, Cache: Cache{Dir: filepath.Join(t.TempDir(), "cache")}}
	s, err := Parse([]byte("base:\n  image: bb\n  workdir: /home/app\nsetup:\n  - cat /only-in-image > s1; echo $FROM_IMAGE >> s1\n"))
	if err != nil {
		t.Fatal(err)
	}
	s.Base.Dir = proj
	r, err := b.Build(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ran != 1 || r.Sandbox.Image == nil || r.Sandbox.Image.Workdir != "/home/app" {
		t.Fatalf("first build: ran %d, image %+v", r.Ran, r.Sandbox.Image)
	}
	if got := cat(t, c, r.Sandbox, "s1"); got != "image file\nyes\n" {
		t.Errorf("setup over the image wrote %q", got)
	}
	if r, err = b.Build(t.Context(), s); err != nil || r.Cached != 1 || r.Sandbox.Image == nil {
		t.Fatalf("second build: %+v %v", r, err)
	}
	// Another image under the same name: the steps run again.
	img2 := testimage.Image(t, v1.Config{Env: []string{"PATH=/bin", "FROM_IMAGE=two"}},
		testimage.Layer(t, testimage.File("bin/busybox", mustRead(t, testimage.Busybox), 0o755), testimage.Symlink("bin/sh", "busybox"),
			testimage.Symlink("bin/cat", "busybox"), testimage.Dir("home/app", 0o755), testimage.File("only-in-image", "image two\n", 0o644)))
	testimage.WriteTarball(t, tb, "example.test/bb:1", img2)
	if _, err := c.ImportImage(t.Context(), api.ImportRequest{Path: tb, Name: "bb"}); err != nil {
		t.Fatal(err)
	}
	if r, err = b.Build(t.Context(), s); err != nil || r.Ran != 1 {
		t.Fatalf("build over the new image: %+v %v", r, err)
	}
	if got := cat(t, c, r.Sandbox, "s1"); got != "image two\ntwo\n" {
		t.Errorf("setup over the new image wrote %q", got)
	}
}

func mustRead(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%s: %v (make deps installs busybox-static)", p, err)
	}
	return string(b)
}

// writeFeature writes a local feature directory under dir.
func writeFeature(t *testing.T, dir, meta, install string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "devcontainer-feature.json"), []byte(meta), 0o644)
	os.WriteFile(filepath.Join(dir, "install.sh"), []byte(install), 0o644)
}

func run(t *testing.T, c *client.Client, sb *api.Sandbox, script string) string {
	t.Helper()
	var out bytes.Buffer
	ex, err := c.Exec(t.Context(), sb.Name, api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: []string{"sh", "-c", script}}}, client.ExecIO{Stdout: &out, Stderr: &out})
	if err != nil || ex.Code != 0 {
		t.Fatalf("%s in %s: %v %+v %s", script, sb.Name, err, ex, out.String())
	}
	return out.String()
}

const featureMeta = `{
  // comments are allowed
  "id": "hello", "version": "1.0.0",
  "options": {
    "greeting": {"type": "string", "default": "hi"},
    "loud": {"type": "boolean", "default": false},
    "install-dir": {"type": "string", "default": "/opt/hello"}
  },
  "containerEnv": {"HELLO_HOME": "/opt/hello", "PATH": "/opt/hello/bin:${PATH}"},
}`

const featureInstall = `#!/bin/sh
set -e
mkdir -p "$INSTALL_DIR/bin"
printf '%s|%s|%s|%s|%s\n' "$GREETING" "$LOUD" "$_REMOTE_USER" "$(id -u)" "$(pwd)" > "$INSTALL_DIR/out"
printf '#!/bin/sh\necho hello\n' > "$INSTALL_DIR/bin/hello"
chmod +x "$INSTALL_DIR/bin/hello"
date +%s%N > "$INSTALL_DIR/stamp"
`

// TestBuildFeatures: a local devcontainer feature installs as root
// before the lifecycle commands, with its options (given or default) in
// install.sh's environment and its containerEnv in the sandbox's; the
// result is cached, and a changed install.sh or option installs again. A
// hostile option value reaches install.sh as a value.
func TestBuildFeatures(t *testing.T) {
	c := daemon(t)
	proj := filepath.Join(t.TempDir(), "proj")
	dc := filepath.Join(proj, ".devcontainer")
	writeFeature(t, filepath.Join(dc, "hello"), featureMeta, featureInstall)
	pwned := filepath.Join(t.TempDir(), "pwned")
	hostile := "$(touch " + pwned + ")`touch " + pwned + "`'\"; touch " + pwned + "\n"
	file := func(greeting string) string {
		g, _ := json.Marshal(greeting)
		doc := `{"remoteUser": "dev", "features": {"./hello": {"greeting": ` + string(g) + `, "loud": true}},
		  "onCreateCommand": "echo $HELLO_HOME > s1; hello >> s1"}`
		if old, _ := os.ReadFile(filepath.Join(dc, "devcontainer.json")); string(old) != doc {
			os.WriteFile(filepath.Join(dc, "devcontainer.json"), []byte(doc), 0o644)
		}
		return filepath.Join(dc, "devcontainer.json")
	}
	b := &Builder{Client: c, Cache: Cache{Dir: filepath.Join(t.TempDir(), "cache")}}
	build := func(greeting string, wantCached, wantRan int) *api.Sandbox {
		t.Helper()
		s, err := LoadDevcontainer(t.Context(), file(greeting), nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := b.Build(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		if r.Cached != wantCached || r.Ran != wantRan {
			t.Fatalf("cached %d ran %d, want %d and %d", r.Cached, r.Ran, wantCached, wantRan)
		}
		return r.Sandbox
	}
	first := build("hey there", 0, 2)
	if got := run(t, c, first, "cat /opt/hello/out"); !strings.HasPrefix(got, "hey there|true|dev|0|/tmp/") {
		t.Errorf("install.sh saw %q", got)
	}
	if got := cat(t, c, first, "s1"); got != "/opt/hello\nhello\n" {
		t.Errorf("onCreateCommand after the feature wrote %q", got)
	}
	stamp := run(t, c, first, "cat /opt/hello/stamp")

	again := build("hey there", 2, 0)
	if got := run(t, c, again, "cat /opt/hello/stamp"); got != stamp {
		t.Errorf("a cached feature was installed again")
	}

	// A changed option installs again.
	other := build(hostile, 0, 2)
	if got := run(t, c, other, "cat /opt/hello/out"); !strings.HasPrefix(got, hostile+"|true|") {
		t.Errorf("hostile value reached install.sh as %q", got)
	}
	if got := run(t, c, other, "test -e "+pwned+" && echo ran || echo not"); got != "not\n" {
		t.Errorf("an option value ran as shell code in the sandbox")
	}

	// A changed install.sh installs again, defaults fill missing options.
	writeFeature(t, filepath.Join(dc, "hello"), featureMeta, featureInstall+"echo changed >> \"$INSTALL_DIR/out\"\n")
	os.WriteFile(filepath.Join(dc, "devcontainer.json"), []byte(`{"features": {"./hello": {}}}`), 0o644)
	s, err := LoadDevcontainer(t.Context(), filepath.Join(dc, "devcontainer.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.Build(t.Context(), s)
	if err != nil || r.Ran != 1 {
		t.Fatalf("changed install.sh: %+v %v", r, err)
	}
	if got := run(t, c, r.Sandbox, "cat /opt/hello/out"); !strings.HasPrefix(got, "hi|false||0|") || !strings.HasSuffix(got, "changed\n") {
		t.Errorf("defaults: install.sh saw %q", got)
	}
	if got := run(t, c, r.Sandbox, "echo $HELLO_HOME; hello"); got != "/opt/hello\nhello\n" {
		t.Errorf("containerEnv in the sandbox: %q", got)
	}
}

// TestBuildOCIFeature: a feature fetched from a registry installs in a
// real sandbox like a local one.
func TestBuildOCIFeature(t *testing.T) {
	c := daemon(t)
	ref := testRegistry(t).host + "/features/hello:1"
	pushFeature(t, ref, featureTar(t, []tarEntry{
		{name: "devcontainer-feature.json", body: featureMeta},
		{name: "install.sh", body: featureInstall},
	}), FeatureLayerType)
	p := devcontainerDir(t, `{"features": {"`+ref+`": {"greeting": "from a registry"}}, "postCreateCommand": "hello > s1"}`)
	s, err := LoadDevcontainer(t.Context(), p, &FeatureFetcher{Dir: filepath.Join(t.TempDir(), "features")})
	if err != nil {
		t.Fatal(err)
	}
	b := &Builder{Client: c, Cache: Cache{Dir: filepath.Join(t.TempDir(), "cache")}}
	r, err := b.Build(t.Context(), s)
	if err != nil || r.Ran != 2 {
		t.Fatalf("build: %+v %v", r, err)
	}
	if got := run(t, c, r.Sandbox, "cat /opt/hello/out"); !strings.HasPrefix(got, "from a registry|false||0|") {
		t.Errorf("install.sh saw %q", got)
	}
	if got := cat(t, c, r.Sandbox, "s1"); got != "hello\n" {
		t.Errorf("postCreateCommand wrote %q", got)
	}
}

// TestBuildFeatureOverImage: over an image whose USER is not root, a
// feature's install.sh still runs as root, and the lifecycle commands as
// the image's user.
func TestBuildFeatureOverImage(t *testing.T) {
	c := daemon(t)
	bb := mustRead(t, testimage.Busybox)
	ents := []testimage.Entry{testimage.Dir("bin", 0o755), testimage.Dir("etc", 0o755), testimage.Dir("tmp", 0o1777), testimage.Dir("opt", 0o755),
		testimage.File("bin/busybox", bb, 0o755),
		testimage.File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n", 0o644),
		testimage.File("etc/group", "root:x:0:\napp:x:1000:\n", 0o644)}
	for _, n := range []string{"sh", "cat", "id", "env", "mktemp", "tar", "chmod", "mkdir", "rm", "printf", "date", "pwd"} {
		ents = append(ents, testimage.Symlink("bin/"+n, "busybox"))
	}
	img := testimage.Image(t, v1.Config{Env: []string{"PATH=/bin"}, User: "app", WorkingDir: "/"}, testimage.Layer(t, ents...))
	tb := filepath.Join(t.TempDir(), "app.tar")
	testimage.WriteTarball(t, tb, "example.test/app:1", img)
	if _, err := c.ImportImage(t.Context(), api.ImportRequest{Path: tb, Name: "app"}); err != nil {
		t.Fatal(err)
	}
	p := devcontainerDir(t, `{"image": "app", "containerUser": "app", "features": {"./hello": {}}, "postCreateCommand": "id -u > s1"}`)
	writeFeature(t, filepath.Join(filepath.Dir(p), "hello"), featureMeta, featureInstall)
	os.Chmod(filepath.Dir(filepath.Dir(p)), 0o777) // the image's user writes s1
	s, err := LoadDevcontainer(t.Context(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &Builder{Client: c, Cache: Cache{Dir: filepath.Join(t.TempDir(), "cache")}}
	r, err := b.Build(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, c, r.Sandbox, "cat /opt/hello/out"); !strings.HasPrefix(got, "hi|false|app|0|/tmp/") {
		t.Errorf("install.sh over the image saw %q", got)
	}
	if got := cat(t, c, r.Sandbox, "s1"); got != "1000\n" {
		t.Errorf("postCreateCommand ran as %q, want the image's user", got)
	}
	if got := run(t, c, r.Sandbox, "echo $PATH"); !strings.HasPrefix(got, "/opt/hello/bin:") {
		t.Errorf("PATH from the feature: %q", got)
	}
}
