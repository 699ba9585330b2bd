package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/sandbox"
	"tine/sandbox/ns"
)

// breakdown times the steps of a create and a fork one by one, through
// the same packages the manager uses.
func (b *bench) breakdown(ctx context.Context, rep *report) error {
	const sec = "breakdown"
	reps := b.o.reps
	snap, err := b.fs.Import(ctx, b.project, "")
	if err != nil {
		return err
	}
	pool, err := b.fs.NewMountPool(ctx, filepath.Join(b.base, "bdmounts"), 2, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	rt, err := ns.New(b.agent)
	if err != nil {
		return err
	}
	wdir := filepath.Join(b.base, "bd")
	w, err := rt.Warm(ctx, sandbox.WarmOptions{Dir: filepath.Join(wdir, "warm"), N: 1, Layers: filepath.Join(wdir, "layers")})
	if err != nil {
		return err
	}
	defer w.Close()
	var imp, walk, br, mnt, cold, coldAgent, warm, warmAgent, wfork, wforkAgent, ex, meta, cp, frz []time.Duration
	since := func(s *[]time.Duration, t time.Time) { *s = append(*s, time.Since(t)) }
	for i := 0; i < reps; i++ {
		t := time.Now()
		if _, err := b.fs.Import(ctx, b.project, ""); err != nil {
			return err
		}
		since(&imp, t)
		// One file changed: the import walks, the index finds the rest.
		if err := os.WriteFile(filepath.Join(b.project, "CHANGED"), []byte(strconv.Itoa(i)), 0o644); err != nil {
			return err
		}
		t = time.Now()
		if _, err := b.fs.Import(ctx, b.project, ""); err != nil {
			return err
		}
		since(&walk, t)
		n := b.name("bd")
		time.Sleep(15 * time.Millisecond)
		t = time.Now()
		if err := b.fs.BranchManyDeferred(ctx, snap, []string{n}); err != nil {
			return err
		}
		since(&br, t)
		t = time.Now()
		m, err := pool.Mount(ctx, n)
		if err != nil {
			return err
		}
		since(&mnt, t)
		// cold: re-executed init step, root, agent start
		spec := sandbox.Spec{ID: "tine-bd-" + n, Hostname: n, Dir: filepath.Join(wdir, n), ProjectPath: b.project, ProjectSource: m.Dir(), Hide: []string{b.base}}
		t = time.Now()
		in, err := b.coldRT.Start(ctx, spec)
		if err != nil {
			return err
		}
		since(&cold, t)
		c, err := client.Dial(ctx, in.AgentSocket())
		if err != nil {
			return err
		}
		since(&coldAgent, t)
		t = time.Now()
		if err := runTrue(ctx, c); err != nil {
			return err
		}
		since(&ex, t)
		c.Close()
		in.Stop(ctx)
		// snapshot copy of the upper layer and a freeze/thaw
		t = time.Now()
		if err := rt.CopyState(ctx, spec.Dir, spec.Dir+".copy"); err != nil {
			return err
		}
		since(&cp, t)
		// warm: bind
		if err := rt.WaitWarm(ctx, 1); err != nil {
			return err
		}
		time.Sleep(60 * time.Millisecond)
		spec.Dir, spec.ID = spec.Dir+".w", spec.ID+"w"
		t = time.Now()
		in, err = rt.Start(ctx, spec)
		if err != nil {
			return err
		}
		since(&warm, t)
		if c, err = client.Dial(ctx, in.AgentSocket()); err != nil {
			return err
		}
		since(&warmAgent, t)
		t = time.Now()
		if err := in.Freeze(ctx); err != nil {
			return err
		}
		if err := in.Thaw(ctx); err != nil {
			return err
		}
		since(&frz, t)
		c.Close()
		in.Stop(ctx)
		// warm fork: bind with the root rebuilt over a copy of a layer
		if err := rt.WaitWarm(ctx, 1); err != nil {
			return err
		}
		time.Sleep(60 * time.Millisecond)
		fspec := spec
		fspec.Dir, fspec.ID, fspec.Seed = spec.Dir+"f", spec.ID+"f", strings.TrimSuffix(spec.Dir, ".w")+".copy"
		t = time.Now()
		in, err = rt.Start(ctx, fspec)
		if err != nil {
			return err
		}
		since(&wfork, t)
		if c, err = client.Dial(ctx, in.AgentSocket()); err != nil {
			return err
		}
		since(&wforkAgent, t)
		c.Close()
		in.Stop(ctx)
		m.Unmount()
		b.fs.DeleteBranch(ctx, n)
		t = time.Now()
		if err := writeSynced(filepath.Join(wdir, "meta.json"), []byte(`{"name":"x"}`)); err != nil {
			return err
		}
		since(&meta, t)
	}
	rep.add(sec, "cowfs", "Import of the project (200 files and its .git, 434 files in all; unchanged, watched)", imp, "")
	rep.add(sec, "cowfs", "Import of the same after one file changed (walk, the rest found by the index)", walk, "")
	rep.add(sec, "cowfs", "Branch, deferred as create makes it (no fdatasync; ADR 0190)", br, "")
	rep.add(sec, "cowfs", "pooled Mount of the branch", mnt, "")
	rep.add(sec, "ns cold", "Start: cgroups, clone, re-exec init, config sent", cold, "")
	rep.add(sec, "ns cold", "... + agent answered its handshake (root built, agent up)", coldAgent, "")
	rep.add(sec, "ns warm", "Start: bind a warm instance (rename, cgroup rename, project)", warm, "")
	rep.add(sec, "ns warm", "... + agent answered its handshake", warmAgent, "")
	rep.add(sec, "ns warm fork", "Start with a new seed: the layer its forks share made (hard links), root rebuilt over it, pivot", wfork, "")
	rep.add(sec, "ns warm fork", "... + agent answered its handshake", wforkAgent, "")
	rep.add(sec, "agent", "Exec true round trip", ex, "")
	rep.add(sec, "metadata", "JSON write: temp file, fsync, rename, dir fsync", meta, "")
	rep.add(sec, "fork", "CopyState of an empty upper layer, as a snapshot copies (in process, reflinks)", cp, "")
	rep.add(sec, "fork", "freeze + thaw of a sandbox's cgroup", frz, "")
	return nil
}

func runTrue(ctx context.Context, c *client.Client) error {
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"true"}, Env: []string{"PATH=" + ns.DefaultPath}})
	if err != nil {
		return err
	}
	_, err = p.Wait(ctx)
	return err
}

func writeSynced(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	f.Write(data)
	f.Sync()
	f.Close()
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
