package spec

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"tine/api"
	"tine/api/client"
	"tine/execpolicy"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// Cache maps a setup step's key to the snapshot holding its result: one
// file per key in Dir, holding the snapshot id. An entry whose snapshot is
// gone is dropped when found so.
type Cache struct{ Dir string }

var snapIDRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^snap-[0-9a-f]{8,64}$`) })

// Get returns the snapshot id cached for key.
func (c Cache) Get(key string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(c.Dir, key))
	if err != nil {
		return "", false
	}
	id := strings.TrimSpace(string(b))
	return id, snapIDRE().MatchString(id)
}

// Put records key's snapshot, atomically.
func (c Cache) Put(key, id string) error {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(c.Dir, "."+key+".tmp")
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(c.Dir, key))
}

func (c Cache) drop(key string) { os.Remove(filepath.Join(c.Dir, key)) }

// Keys are the cache keys of a spec's setup steps over a base: key i
// covers the base's content (its cowfs snapshot id, a content hash), the
// OS image's manifest digest (imageDigest; "" for the host's OS), the
// environment, the network policy and steps 0..i (a step's command, and
// for a step with input, such as a devcontainer feature, the input's hash
// and whether it runs as root). The same spec over the
// same files gives the same keys; a changed step changes its key and
// every later one, and so does another image under the same name.
func Keys(s *Spec, baseID, imageDigest string) []string {
	h := sha256.New()
	fmt.Fprintf(h, "tine-setup-v2\x00%s\x00%s\x00%s\x00", baseID, imageDigest, s.Base.Workdir)
	for _, e := range s.EnvList() {
		fmt.Fprintf(h, "env\x00%s\x00", e)
	}
	// The steps run under the spec's network policy: what they can fetch
	// depends on it.
	if n, err := s.NetworkRequest(); err == nil && n != nil {
		fmt.Fprintf(h, "net\x00%s\x00%s\x00", n.Mode, strings.Join(n.Allow, "\x00"))
	}
	prev := h.Sum(nil)
	keys := make([]string, len(s.Setup))
	for i, st := range s.Setup {
		h := sha256.New()
		h.Write(prev)
		fmt.Fprintf(h, "\x00step\x00%s\x00", st.Run)
		if len(st.Input) > 0 || st.Root {
			// Only then, so that the keys of plain steps stay as they were.
			fmt.Fprintf(h, "input\x00%x\x00root\x00%t\x00", sha256.Sum256(st.Input), st.Root)
		}
		prev = h.Sum(nil)
		keys[i] = hex.EncodeToString(prev)
	}
	return keys
}

// Result is what Build made.
type Result struct {
	Sandbox *api.Sandbox
	// Cached counts setup steps taken from the cache; Ran those run now.
	Cached, Ran int
}

// Builder creates a spec's sandbox through the daemon's API.
type Builder struct {
	Client *client.Client
	Cache  Cache
	// Log, when not nil, receives progress lines and the output of setup
	// steps.
	Log io.Writer
}

func (b *Builder) logf(format string, a ...any) {
	if b.Log != nil {
		fmt.Fprintf(b.Log, format+"\n", a...)
	}
}

// Build creates and starts the spec's sandbox. Setup steps whose results
// are cached are not run again: the sandbox starts from the snapshot of
// the last cached step, runs the steps after it, and caches each. A spec
// with Pending fields is refused, naming each.
func (b *Builder) Build(ctx context.Context, s *Spec) (*Result, error) {
	if len(s.Pending) > 0 {
		return nil, fmt.Errorf("the spec asks for what this tine cannot do yet:\n  %s", strings.Join(s.Pending, "\n  "))
	}
	limits, err := s.SandboxLimits()
	if err != nil {
		return nil, err
	}
	netReq, err := s.NetworkRequest()
	if err != nil {
		return nil, err
	}
	policy, err := s.ExecPolicy()
	if err != nil {
		return nil, err
	}
	var services []string
	for _, st := range s.Services {
		services = append(services, st.Run)
	}
	final := api.CreateRequest{Name: s.Name, Env: s.EnvList(), Limits: limits, Services: services,
		Network: netReq, Secrets: s.SecretBindings(), MessageTo: s.MessageTo,
		Image: s.Base.Image, ImageWorkdir: s.Base.Workdir}
	// Setup runs under the spec's limits and network, without its
	// lifetime or secrets.
	setupLimits := limits
	setupLimits.Lifetime = 0
	r, err := b.build(ctx, s, final, setupLimits)
	if err != nil {
		return nil, err
	}
	if err := b.apply(ctx, s, r.Sandbox.Name, policy); err != nil {
		b.Client.Remove(context.WithoutCancel(ctx), r.Sandbox.Name)
		return nil, err
	}
	if sb, err := b.Client.Get(ctx, r.Sandbox.Name); err == nil {
		r.Sandbox = sb
	}
	return r, nil
}

// apply sets what follows creation: the exec policy, then the exposed
// ports (each on the same host port when free).
func (b *Builder) apply(ctx context.Context, s *Spec, name string, policy *execpolicy.Policy) error {
	if policy != nil {
		if _, err := b.Client.SetExecPolicy(ctx, name, policy); err != nil {
			return fmt.Errorf("exec policy: %w", err)
		}
	}
	for _, p := range s.Expose {
		ex, err := b.Client.Expose(ctx, name, api.ExposeRequest{Port: p})
		if err != nil {
			return fmt.Errorf("expose %d: %w", p, err)
		}
		b.logf("exposed port %d at %s:%d", p, ex.HostAddress, ex.HostPort)
	}
	return nil
}

// build creates the sandbox final describes from the spec's setup result.
func (b *Builder) build(ctx context.Context, s *Spec, final api.CreateRequest, limits sandbox.Limits) (*Result, error) {
	if len(s.Setup) == 0 {
		final.From = s.Base.Dir
		sb, err := b.Client.Create(ctx, final)
		if err != nil {
			return nil, err
		}
		return &Result{Sandbox: sb}, nil
	}

	// The builder starts from the base directory: its origin is the
	// content id the keys start from.
	bld, err := b.Client.Create(ctx, api.CreateRequest{From: s.Base.Dir, Env: s.EnvList(), Limits: limits, Network: final.Network,
		Image: s.Base.Image, ImageWorkdir: s.Base.Workdir})
	if err != nil {
		return nil, err
	}
	// What is made from the setup's snapshots keeps the builder's image.
	final.Image, final.ImageWorkdir = "", ""
	defer func() {
		if bld != nil {
			b.Client.Remove(context.WithoutCancel(ctx), bld.Name)
		}
	}()
	digest := ""
	if bld.Image != nil {
		digest = bld.Image.Digest
	}
	keys := Keys(s, bld.Origin, digest)
	// The longest cached prefix of steps.
	done, from := 0, ""
	for i := len(keys) - 1; i >= 0; i-- {
		if id, ok := b.Cache.Get(keys[i]); ok {
			done, from = i+1, id
			break
		}
	}
	if done > 0 && done < len(keys) {
		// Continue from the cached step: a builder over its snapshot.
		nb, err := b.Client.Create(ctx, api.CreateRequest{From: from, Env: s.EnvList(), Limits: limits, Network: final.Network})
		if errors.Is(err, sandbox.ErrNotFound) {
			b.logf("setup: cached snapshot %s is gone; running every step", from)
			b.Cache.drop(keys[done-1])
			done, from = 0, ""
		} else if err != nil {
			return nil, err
		} else {
			b.Client.Remove(ctx, bld.Name)
			bld = nb
		}
	}
	for i := done; i < len(keys); i++ {
		st := s.Setup[i]
		label := st.Name
		if label == "" {
			label = fmt.Sprintf("step %d", i+1)
		}
		if st.Input != nil {
			b.logf("setup %d/%d (%s)", i+1, len(keys), label)
		} else {
			b.logf("setup %d/%d (%s): %s", i+1, len(keys), label, st.Run)
		}
		var out io.Writer = io.Discard
		if b.Log != nil {
			out = b.Log
		}
		req := proto.ExecRequest{Argv: []string{"sh", "-c", st.Run}, Dir: bld.ProjectPath}
		eio := client.ExecIO{Stdout: out, Stderr: out}
		if st.Root {
			var root uint32
			req.UID, req.GID = &root, &root
		}
		if len(st.Input) > 0 {
			eio.Stdin = bytes.NewReader(st.Input)
		}
		ex, err := b.Client.Exec(ctx, bld.Name, api.ExecRequest{ExecRequest: req}, eio)
		if err != nil {
			return nil, fmt.Errorf("setup step %d (%s): %w", i+1, label, err)
		}
		if ex.Code != 0 {
			return nil, fmt.Errorf("setup step %d (%s) exited with %d (signal %d); fix it and create again: the steps before it are cached", i+1, label, ex.Code, ex.Signal)
		}
		snap, err := b.Client.Snapshot(ctx, bld.Name, api.SnapshotRequest{})
		if err != nil {
			return nil, fmt.Errorf("setup step %d (%s): snapshot: %w", i+1, label, err)
		}
		if err := b.Cache.Put(keys[i], snap.ID); err != nil {
			return nil, fmt.Errorf("setup cache %s: %w", b.Cache.Dir, err)
		}
		from = snap.ID
	}
	b.Client.Remove(ctx, bld.Name)
	bld = nil
	final.From = from
	sb, err := b.Client.Create(ctx, final)
	if errors.Is(err, sandbox.ErrNotFound) && done == len(keys) {
		// The fully cached result was removed: build again.
		b.Cache.drop(keys[len(keys)-1])
		return b.build(ctx, s, final, limits)
	}
	if err != nil {
		return nil, err
	}
	return &Result{Sandbox: sb, Cached: done, Ran: len(keys) - done}, nil
}
