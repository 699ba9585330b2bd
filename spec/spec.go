// Package spec reads an environment spec, tine.yaml (or a
// devcontainer.json, as input), into what creating its sandbox takes: the
// base, setup steps, services, env and limits, and the fields whose
// mechanism this tine does not have yet, which creation refuses rather
// than ignores. Build runs the setup steps once and caches each step's
// result as a snapshot keyed by content (build.go). docs/spec.md
// describes the format; docs/tine.schema.json is its JSON Schema.
package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"tine/sandbox"
)

// MaxFileBytes bounds a spec file.
const MaxFileBytes = 1 << 20

// Spec is one environment.
type Spec struct {
	// Name is the sandbox's name; empty: generated.
	Name string `yaml:"name,omitempty"`
	Base Base   `yaml:"base,omitempty"`
	// Setup runs once, in order, in the project directory; each step's
	// result is cached.
	Setup    []Step            `yaml:"setup,omitempty"`
	Services []Step            `yaml:"services,omitempty"`
	Env      map[string]string `yaml:"env,omitempty"`
	Limits   Limits            `yaml:"limits,omitempty"`
	Network  *Network          `yaml:"network,omitempty"`
	Secrets  []Secret          `yaml:"secrets,omitempty"`
	Expose   []int             `yaml:"expose,omitempty"`
	Exec     *ExecPolicy       `yaml:"exec,omitempty"`
	Lifetime string            `yaml:"lifetime,omitempty"`
	// MessageTo is which sandboxes it may message: family (the
	// default), none, or family and name globs ("family,worker-*").
	MessageTo string `yaml:"message_to,omitempty"`

	// Pending lists what the spec asks for that this tine cannot do yet,
	// each with the reason; creation refuses a spec with any.
	Pending []string `yaml:"-"`
}

// Base is what the sandbox starts from: the project directory, over the
// host's OS or an OCI image (docs/images.md).
type Base struct {
	// Dir is the project directory; relative paths are from the spec
	// file's directory (default: that directory).
	Dir string `yaml:"dir,omitempty"`
	// OS is "host" (the default): the host's files under a private
	// writable layer.
	OS string `yaml:"os,omitempty"`
	// Image names an image in the daemon's store (tine image pull or
	// import adds it) whose root file system is the OS in place of the
	// host's; the project is still at its path.
	Image string `yaml:"image,omitempty"`
	// Workdir, with Image, is the working directory of commands that give
	// none (default: the project directory).
	Workdir string `yaml:"workdir,omitempty"`
}

// Step is one command, run with sh -c. In YAML it is a string or
// {run: ..., name: ...}.
type Step struct {
	Name string `yaml:"name,omitempty"`
	Run  string `yaml:"run"`

	// Input, when not empty, is the command's standard input; its bytes
	// are part of the step's cache key (a devcontainer feature's files).
	Input []byte `yaml:"-"`
	// Root runs the command as root rather than the image's user.
	Root bool `yaml:"-"`
}

// UnmarshalYAML takes a plain string as {run: STRING}.
func (s *Step) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		return n.Decode(&s.Run)
	}
	type plain Step
	var p plain
	if err := decodeStrict(n, &p); err != nil {
		return err
	}
	*s = Step(p)
	return nil
}

// decodeStrict decodes a mapping node refusing unknown keys.
func decodeStrict(n *yaml.Node, v any) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	d := yaml.NewDecoder(bytes.NewReader(b))
	d.KnownFields(true)
	return d.Decode(v)
}

// Limits are the sandbox's resource limits.
type Limits struct {
	Pids int64 `yaml:"pids,omitempty"`
	// Disk is the most bytes written into the project: 512M, 2G...
	Disk string `yaml:"disk,omitempty"`
	// Memory bounds the sandbox's memory, its tmpfs files included: 512M,
	// 2G...
	Memory string `yaml:"memory,omitempty"`
	// CPUs is the CPU time per second the sandbox may use, in CPUs.
	CPUs float64 `yaml:"cpus,omitempty"`
}

// Network is the egress policy: mode none (the default without the
// section), allow (only the allow-list; the default with one) or open.
type Network struct {
	Mode string `yaml:"mode,omitempty"`
	// Allow lists the host names, *.names, addresses or CIDRs (each with
	// an optional :PORT or :LO-HI) the sandbox may reach.
	Allow []string `yaml:"allow,omitempty"`
}

// Secret binds a secret stored in the daemon ("tine secret set NAME") to
// the one destination that receives it: the sandbox sees a placeholder in
// $NAME, and the gateway sets Header to "Prefix value" on HTTPS requests
// to Destination, which the network policy must allow.
type Secret struct {
	Name        string `yaml:"name"`
	Destination string `yaml:"destination"`
	Header      string `yaml:"header"`
	Prefix      string `yaml:"prefix,omitempty"`
}

// ExecPolicy says which commands the API runs: glob patterns over the
// command line, each list one action (see the execpolicy package).
type ExecPolicy struct {
	Allow []string `yaml:"allow,omitempty"`
	Ask   []string `yaml:"ask,omitempty"`
	Deny  []string `yaml:"deny,omitempty"`
	// FreezeOnAsk freezes the sandbox while a command waits for a person.
	FreezeOnAsk bool `yaml:"freeze_on_ask,omitempty"`
}

var (
	nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._-]{1,63}$`) })
	envRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Load reads a tine.yaml file; relative paths in it are from its directory.
func Load(path string) (*Spec, error) {
	b, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	s.resolveDir(filepath.Dir(abs))
	return s, nil
}

// readBounded reads a file of at most MaxFileBytes.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes; a spec is a small file", path, MaxFileBytes)
	}
	return b, nil
}

// resolveDir makes Base.Dir absolute against dir.
func (s *Spec) resolveDir(dir string) {
	switch {
	case s.Base.Dir == "":
		s.Base.Dir = dir
	case !filepath.IsAbs(s.Base.Dir):
		s.Base.Dir = filepath.Join(dir, s.Base.Dir)
	}
}

// Parse decodes and checks a tine.yaml document. Unknown fields are
// errors that name them.
func Parse(b []byte) (*Spec, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("spec larger than %d bytes", MaxFileBytes)
	}
	d := yaml.NewDecoder(bytes.NewReader(b))
	d.KnownFields(true)
	var s Spec
	if err := d.Decode(&s); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("tine.yaml: %w", err)
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Check validates the fields and fills Pending.
func (s *Spec) Check() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if s.Name != "" && !nameRE().MatchString(s.Name) {
		bad("name %q: want 1-63 of [A-Za-z0-9._-]", s.Name)
	}
	if s.Base.OS != "" && s.Base.OS != "host" {
		bad("base.os %q: the only OS base is \"host\"; for an image use base.image", s.Base.OS)
	}
	if s.Base.OS == "host" && s.Base.Image != "" {
		bad("base: give os: host or image, not both")
	}
	if len(s.Base.Image) > 1024 || strings.ContainsAny(s.Base.Image, "\x00\n ") {
		bad("base.image %q: want an image reference ([REGISTRY/]REPOSITORY[:TAG|@DIGEST]) or digest", s.Base.Image)
	}
	if s.Base.Workdir != "" && (s.Base.Image == "" || !filepath.IsAbs(s.Base.Workdir)) {
		bad("base.workdir %q: want an absolute directory, with base.image", s.Base.Workdir)
	}
	for i, st := range s.Setup {
		if strings.TrimSpace(st.Run) == "" {
			bad("setup[%d]: empty run", i)
		}
	}
	for i, st := range s.Services {
		if strings.TrimSpace(st.Run) == "" {
			bad("services[%d]: empty run", i)
		}
	}
	for k := range s.Env {
		if !envRE.MatchString(k) {
			bad("env %q: want a name of [A-Za-z_][A-Za-z0-9_]*", k)
		}
	}
	if s.Limits.Pids < 0 {
		bad("limits.pids %d: want a positive number", s.Limits.Pids)
	}
	if s.Limits.Disk != "" {
		if _, err := ParseSize(s.Limits.Disk); err != nil {
			bad("limits.disk: %v", err)
		}
	}
	for _, p := range s.Expose {
		if p < 1 || p > 65535 {
			bad("expose %d: want a port 1-65535", p)
		}
	}
	if s.Lifetime != "" {
		if d, err := time.ParseDuration(s.Lifetime); err != nil || d <= 0 {
			bad("lifetime %q: want a duration such as 30m or 2h", s.Lifetime)
		}
	}
	if s.Limits.Memory != "" {
		if _, err := ParseSize(s.Limits.Memory); err != nil {
			bad("limits.memory: %v", err)
		}
	}
	if _, err := sandbox.ParseMessagePolicy(s.MessageTo); err != nil {
		bad("message_to: %v", err)
	}
	if s.Limits.CPUs < 0 {
		bad("limits.cpus %g: want a positive number of CPUs", s.Limits.CPUs)
	}
	if _, err := s.NetworkRequest(); err != nil {
		bad("%v", err)
	}
	for i, b := range s.SecretBindings() {
		if _, err := sandbox.ParseSecretBinding(b.String()); err != nil {
			bad("secrets[%d]: %v", i, err)
		}
	}
	if _, err := s.ExecPolicy(); err != nil {
		bad("exec: %v", err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.Pending = nil
	return nil
}

// defaultPath is PATH over the host's OS when the spec sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// EnvList is Env as sorted KEY=VALUE pairs, PATH first set when absent.
func (s *Spec) EnvList() []string {
	if len(s.Env) == 0 {
		return nil
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []string
	// An image's own PATH comes with its environment, under this one.
	if _, ok := s.Env["PATH"]; !ok && s.Base.Image == "" {
		out = append(out, "PATH="+defaultPath)
	}
	for _, k := range keys {
		out = append(out, k+"="+s.Env[k])
	}
	return out
}

// ParseSize reads a byte count: 1048576, 512K, 64M, 2G, 1T (powers of 1024).
func ParseSize(v string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(v))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a positive number of bytes, or one with K, M, G or T", v)
	}
	return n * mult, nil
}
