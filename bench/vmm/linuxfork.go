package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"tine/guestagent/client"
	"tine/guestagent/proto"
	"tine/sandbox"
	"tine/sandbox/vm"
	"tine/vmm/linux/kernels"
)

// linuxFork measures, where /dev/kvm is hardware-backed, the time from
// forking a Linux guest that runs a TCP service (the vm runtime's
// Freeze, CopyState, Thaw, Start) to the clone's first answered request
// to that service. Elsewhere it says why it ran nothing.
func linuxFork(ctx context.Context, o options, w io.Writer) error {
	fmt.Fprintln(w, "## Linux guest: fork to first answered request")
	fmt.Fprintln(w)
	p := vm.Probe()
	if p.Support != vm.Native {
		fmt.Fprintf(w, "Not run: the host is %s (%s); a Linux guest's fork is measured only where /dev/kvm is VMX or SVM. The nested harness checks it for correctness, not speed (vmm/nested TestVMRuntimeUnderKVM).\n\n", kvmKind(), p.Detail)
		return nil
	}
	k, err := kernels.Find()
	if err != nil {
		fmt.Fprintf(w, "Not run: %v\n\n", err)
		return nil
	}
	agent := os.Getenv("TINE_VM_AGENT")
	if agent == "" {
		agent, _ = exec.LookPath("tine-agent")
	}
	if agent == "" {
		fmt.Fprintln(w, "Not run: no static tine-agent (set TINE_VM_AGENT or put it on PATH)")
		fmt.Fprintln(w)
		return nil
	}
	dir, err := os.MkdirTemp("", "bench-linuxfork")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	r, err := vm.New(vm.Config{Kernel: k.Vmlinux, Modules: k.Dir, Agent: agent, Busybox: "/bin/busybox",
		MemSize: 256 << 20, StoreDir: filepath.Join(dir, "store")})
	if err != nil {
		return err
	}
	parent, err := r.Start(ctx, sandbox.Spec{ID: "p", Dir: filepath.Join(dir, "p")})
	if err != nil {
		return err
	}
	defer parent.Stop(context.Background())
	if _, err := guestSh(ctx, parent, "setsid nc -ll -p 8080 -e echo served </dev/null >/dev/null 2>&1 & sleep 1"); err != nil {
		return err
	}
	n := max(5, o.forks/50)
	var d dist
	for i := range n {
		t0 := time.Now()
		parent.Freeze(ctx)
		snap := filepath.Join(dir, fmt.Sprintf("s%d", i))
		err := r.CopyState(ctx, filepath.Join(dir, "p"), snap)
		parent.Thaw(ctx)
		if err != nil {
			return err
		}
		k, err := r.Start(ctx, sandbox.Spec{ID: fmt.Sprint(i), Dir: filepath.Join(dir, fmt.Sprintf("c%d", i)), Seed: snap})
		if err != nil {
			return err
		}
		out, err := guestSh(ctx, k, "echo | nc 127.0.0.1 8080")
		d.add(time.Since(t0))
		k.Stop(context.Background())
		if err != nil || strings.TrimSpace(out) != "served" {
			return fmt.Errorf("clone %d: the service answered %q: %v", i, out, err)
		}
	}
	fmt.Fprintf(w, "| forks | p50 | p99 |\n|---|---|---|\n| %d | %s | %s |\n\n", n, ms(d.q(0.5)), ms(d.q(0.99)))
	return nil
}

// guestSh runs a shell command in a vm sandbox through its agent.
func guestSh(ctx context.Context, in sandbox.Instance, script string) (string, error) {
	c, err := client.Dial(ctx, in.AgentSocket())
	if err != nil {
		return "", err
	}
	defer c.Close()
	p, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, Timeout: time.Minute})
	if err != nil {
		return "", err
	}
	out, _ := io.ReadAll(p.Stdout)
	_, err = p.Wait(ctx)
	return string(out), err
}
