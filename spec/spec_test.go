package spec

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"tine/execpolicy"
)

const full = `
name: web
base:
  dir: app
setup:
  - apt-get install -y jq
  - name: deps
    run: make deps
services:
  - python3 -m http.server 8000
env:
  GREETING: hi
limits:
  pids: 256
  disk: 2G
`

func TestParse(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "tine.yaml")
	os.WriteFile(p, []byte(full), 0o644)
	s, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "web" || s.Base.Dir != filepath.Join(dir, "app") || len(s.Setup) != 2 || s.Setup[0].Run != "apt-get install -y jq" ||
		s.Setup[1].Name != "deps" || s.Services[0].Run != "python3 -m http.server 8000" || s.Limits.Pids != 256 || len(s.Pending) != 0 {
		t.Fatalf("%+v", s)
	}
	if env := s.EnvList(); !slices.Contains(env, "GREETING=hi") || !strings.HasPrefix(env[0], "PATH=") {
		t.Errorf("env %v", env)
	}
	if n, _ := ParseSize(s.Limits.Disk); n != 2<<30 {
		t.Errorf("disk %d", n)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"nmae: x\n", "field nmae not found"},
		{"setup:\n  - run: x\n    shell: bash\n", "field shell not found"},
		{"name: 'bad name'\n", "want 1-63"},
		{"env:\n  1X: y\n", "env \"1X\""},
		{"limits:\n  disk: lots\n", "limits.disk"},
		{"expose: [70000]\n", "expose 70000"},
		{"lifetime: forever\n", "lifetime"},
		{"setup:\n  - ''\n", "setup[0]: empty run"},
		{"base:\n  os: windows\n", "base.os"},
		{"limits:\n  memory: much\n", "limits.memory"},
		{"limits:\n  cpus: -1\n", "limits.cpus"},
		{"network:\n  mode: some\n", "unknown mode"},
		{"network:\n  mode: none\n  allow: [x.com]\n", "takes no allow-list"},
		{"network:\n  allow: ['bad host!']\n", "network"},
		{"secrets:\n  - name: T\n    destination: 'a b'\n    header: Authorization\n", "secrets[0]"},
		{"secrets:\n  - name: T\n    destinations: [x.com]\n", "field destinations not found"},
		{"exec:\n  allow: [x]\n  deny: [x]\n", "given twice"},
	} {
		_, err := Parse([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.doc, err, c.want)
		}
	}
}

// TestPending: fields whose mechanism is missing are named, not ignored;
// base.image and base.workdir are taken.
func TestPending(t *testing.T) {
	s, err := Parse([]byte("base:\n  image: debian:12\n  workdir: /work\nexpose: [8000]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Pending) != 0 || s.Base.Image != "debian:12" || s.Base.Workdir != "/work" {
		t.Errorf("pending %q, base %+v", s.Pending, s.Base)
	}
	if _, err := Parse([]byte("base:\n  workdir: /work\n")); err == nil || !strings.Contains(err.Error(), "base.workdir") {
		t.Errorf("workdir without image: %v", err)
	}
	s.Pending = []string{"thing: not yet"}
	if _, err := (&Builder{}).Build(t.Context(), s); err == nil || !strings.Contains(err.Error(), "thing: not yet") {
		t.Errorf("Build of a spec with pending fields: %v", err)
	}
}

const policies = `
limits:
  pids: 64
  disk: 1G
  memory: 512M
  cpus: 1.5
network:
  allow: [api.github.com, "10.0.0.0/8:443"]
secrets:
  - name: GITHUB_TOKEN
    destination: api.github.com
    header: Authorization
    prefix: Bearer
expose: [8000, 9000]
exec:
  allow: ["go *", "make *"]
  ask: ["*"]
  deny: ["rm -rf *"]
  freeze_on_ask: true
lifetime: 90m
`

// TestRequest: limits, lifetime, network and secrets map onto the create
// request, the exec policy onto the execpolicy rules.
func TestRequest(t *testing.T) {
	s, err := Parse([]byte(policies))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Pending) != 0 {
		t.Fatalf("pending %q", s.Pending)
	}
	l, err := s.SandboxLimits()
	if err != nil || l.Pids != 64 || l.ProjectBytes != 1<<30 || l.MemoryBytes != 512<<20 || l.CPUs != 1.5 || l.Lifetime != 90*time.Minute {
		t.Errorf("limits %+v %v", l, err)
	}
	n, err := s.NetworkRequest()
	if err != nil || n.Mode != "allow" || !slices.Equal(n.Allow, []string{"api.github.com", "10.0.0.0/8:443"}) {
		t.Errorf("network %+v %v", n, err)
	}
	bs := s.SecretBindings()
	if len(bs) != 1 || bs[0].String() != "GITHUB_TOKEN=api.github.com:header:Authorization:Bearer" {
		t.Errorf("secrets %+v", bs)
	}
	p, err := s.ExecPolicy()
	if err != nil || len(p.Rules) != 4 || !p.FreezeOnAsk {
		t.Fatalf("exec %+v %v", p, err)
	}
	for cmd, want := range map[string]execpolicy.Action{"go test ./...": "allow", "rm -rf /": "deny", "curl x": "ask"} {
		if d := p.Decide(strings.Fields(cmd)); d.Action != want {
			t.Errorf("%q: %s, want %s", cmd, d.Action, want)
		}
	}
	// Without a section: no network request, no policy.
	s, _ = Parse([]byte("name: x\n"))
	if n, _ := s.NetworkRequest(); n != nil {
		t.Errorf("network %+v without a section", n)
	}
	if p, _ := s.ExecPolicy(); p != nil {
		t.Errorf("exec %+v without a section", p)
	}
	s, _ = Parse([]byte("network:\n  mode: open\n"))
	if n, _ := s.NetworkRequest(); n == nil || n.Mode != "open" {
		t.Errorf("mode open: %+v", n)
	}
}

const devc = `// A devcontainer, as editors write it.
{
  "name": "proj",
  /* the image */
  "image": "mcr.microsoft.com/devcontainers/go:1",
  "containerEnv": { "A": "1", "URL": "http://x//y" },
  "remoteEnv": { "PATH": "${containerEnv:PATH}:/x", "B": "2" },
  "forwardPorts": [8080,],
  "onCreateCommand": "echo one",
  "postCreateCommand": ["sh", "-c", "echo 'two'"],
  "updateContentCommand": { "b": "echo four", "a": "echo three" },
  "postStartCommand": "sleep 1000",
}
`

func TestDevcontainer(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, ".devcontainer"), 0o755)
	p := filepath.Join(dir, ".devcontainer", "devcontainer.json")
	os.WriteFile(p, []byte(devc), 0o644)
	s, err := LoadDevcontainer(t.Context(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Base.Dir != dir || s.Base.Image == "" || s.Name != "proj" {
		t.Errorf("base %+v name %q", s.Base, s.Name)
	}
	var runs []string
	for _, st := range s.Setup {
		runs = append(runs, st.Run)
	}
	want := []string{"echo one", "echo three", "echo four", `'sh' '-c' 'echo '\''two'\'''`}
	if !slices.Equal(runs, want) {
		t.Errorf("setup %q, want %q", runs, want)
	}
	if len(s.Services) != 1 || s.Services[0].Run != "sleep 1000" {
		t.Errorf("services %+v", s.Services)
	}
	if s.Env["A"] != "1" || s.Env["URL"] != "http://x//y" || s.Env["B"] != "2" || s.Env["PATH"] != "" {
		t.Errorf("env %v", s.Env)
	}
	if len(s.Expose) != 1 || s.Expose[0] != 8080 {
		t.Errorf("expose %v", s.Expose)
	}
	if j := strings.Join(s.Pending, "\n"); strings.Contains(j, "base.image") || strings.Contains(j, "expose") {
		t.Errorf("pending %q", j)
	}
}

// TestDevcontainerInitializeCommand: the host-side command is refused,
// with the reason.
func TestDevcontainerInitializeCommand(t *testing.T) {
	for _, v := range []string{`"touch /tmp/pwned"`, `["touch", "/tmp/pwned"]`, `{"x": "touch /tmp/pwned"}`} {
		_, err := ParseDevcontainer([]byte(`{"initializeCommand": ` + v + `, "postCreateCommand": "true"}`))
		if err == nil || !strings.Contains(err.Error(), "initializeCommand runs on the host") {
			t.Errorf("initializeCommand %s: %v", v, err)
		}
	}
	s, err := ParseDevcontainer([]byte(`{"features": {"ghcr.io/devcontainers/features/node:1": {}}}`))
	if err != nil || !strings.Contains(strings.Join(s.Pending, ""), "features") {
		t.Errorf("features: %v %v", s, err)
	}
}

func TestStripJSONC(t *testing.T) {
	for in, want := range map[string]string{
		`{"a": "//not a comment", /* c */ "b": [1, 2,], }`: `{"a":"//not a comment","b":[1,2]}`,
		"{\"a\": 1 // end\n}":                              `{"a":1}`,
		`{"a": "quote \" /* x */"}`:                        `{"a":"quote \" /* x */"}`,
	} {
		var v any
		if err := json.Unmarshal(StripJSONC([]byte(in)), &v); err != nil {
			t.Errorf("%s: %v (%s)", in, err, StripJSONC([]byte(in)))
			continue
		}
		got, _ := json.Marshal(v)
		var w any
		json.Unmarshal([]byte(want), &w)
		wb, _ := json.Marshal(w)
		if string(got) != string(wb) {
			t.Errorf("%s: got %s want %s", in, got, wb)
		}
	}
}

func TestKeys(t *testing.T) {
	a, _ := Parse([]byte("setup: [one, two, three]\n"))
	b, _ := Parse([]byte("setup: [one, TWO, three]\n"))
	ka, kb := Keys(a, "root-1", ""), Keys(b, "root-1", "")
	if ka[0] != kb[0] || ka[1] == kb[1] || ka[2] == kb[2] {
		t.Errorf("a changed step 2 must keep key 1 and change keys 2 and 3: %v %v", ka, kb)
	}
	if k := Keys(a, "root-2", ""); k[0] == ka[0] {
		t.Errorf("another base gives the same key")
	}
	if k := Keys(a, "root-1", ""); !slices.Equal(k, ka) {
		t.Errorf("keys not stable")
	}
	n, _ := Parse([]byte("setup: [one, two, three]\nnetwork:\n  allow: [deb.debian.org]\n"))
	if k := Keys(n, "root-1", ""); k[0] == ka[0] {
		t.Errorf("another network policy gives the same key")
	}
	// A step's input (a feature's files) and its user count.
	fa := &Spec{Setup: []Step{{Run: "x", Input: []byte("one")}, {Run: "y"}}}
	fb := &Spec{Setup: []Step{{Run: "x", Input: []byte("two")}, {Run: "y"}}}
	fr := &Spec{Setup: []Step{{Run: "x", Input: []byte("one"), Root: true}, {Run: "y"}}}
	if k := Keys(fa, "root-1", ""); k[0] == Keys(fb, "root-1", "")[0] || k[1] == Keys(fb, "root-1", "")[1] || k[0] == Keys(fr, "root-1", "")[0] {
		t.Errorf("keys do not follow a step's input or user")
	}
	// The image counts by manifest digest, not by name.
	i, _ := Parse([]byte("base:\n  image: bb\nsetup: [one, two, three]\n"))
	ki := Keys(i, "root-1", "sha256:aaaa")
	if ki[0] == ka[0] || Keys(i, "root-1", "sha256:bbbb")[0] == ki[0] || !slices.Equal(Keys(i, "root-1", "sha256:aaaa"), ki) {
		t.Errorf("keys do not follow the image digest")
	}
}

// TestMessageTo: message_to takes the policies tine create takes and
// refuses the rest.
func TestMessageTo(t *testing.T) {
	for _, ok := range []string{"", "family", "none", "family,worker-*", "w?"} {
		s, err := Parse([]byte("message_to: \"" + ok + "\"\n"))
		if err == nil {
			err = s.Check()
		}
		if err != nil {
			t.Errorf("message_to %q: %v", ok, err)
		}
	}
	for _, bad := range []string{"none,family", "../x", "a/b", "["} {
		s, err := Parse([]byte("message_to: \"" + bad + "\"\n"))
		if err == nil {
			err = s.Check()
		}
		if err == nil || !strings.Contains(err.Error(), "message_to") {
			t.Errorf("message_to %q: %v", bad, err)
		}
	}
}
