package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"tine/sandbox/vm"
)

// vmFlags are create's flags that choose the runtime. A vm guest's
// kernel, memory and vCPUs are the daemon's (tine serve --vm-kernel,
// --vm-memory, --vm-cpus); create's --memory and --cpus are cgroup limits,
// which vm sandboxes refuse.
type vmFlags struct {
	runtime string
}

func (vf *vmFlags) flags(f *pflag.FlagSet) {
	f.StringVar(&vf.runtime, "runtime", "ns", "runtime of the sandbox: ns (namespaces) or vm (a Linux VM, sized by the daemon: see docs/sandboxes.md)")
}

// check refuses what this host cannot run, with the reason.
func (vf *vmFlags) check() error {
	switch vf.runtime {
	case "ns", "":
		return nil
	case "vm":
	default:
		return usageErr("--runtime %q: want ns or vm", vf.runtime)
	}
	p := vm.Probe()
	if p.Support != vm.Native && os.Getenv(EnvVM) != "on" {
		return fmt.Errorf("vm sandboxes cannot run on this host (%s): %s; use --runtime ns", p.Support, p.Detail)
	}
	return nil
}

// name is the runtime the request names ("" for the daemon's default).
func (vf *vmFlags) name() string {
	if vf.runtime == "ns" {
		return ""
	}
	return vf.runtime
}
