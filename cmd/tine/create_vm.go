package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"tine/sandbox/vm"
)

// vmFlags are create's flags that choose the runtime and size a vm
// sandbox.
type vmFlags struct {
	runtime, kernel, memory string
	cpus                    int
}

func (vf *vmFlags) flags(f *pflag.FlagSet) {
	f.StringVar(&vf.runtime, "runtime", "ns", "runtime of the sandbox: ns (namespaces) or vm (a Linux VM, see docs/sandboxes.md)")
	f.StringVar(&vf.kernel, "kernel", "", "vm runtime: the guest kernel (default: Debian's cloud kernel from `make kernels`)")
	f.StringVar(&vf.memory, "memory", "512M", "vm runtime: guest memory, such as 2G")
	f.IntVar(&vf.cpus, "cpus", 1, "vm runtime: vCPUs")
}

// check refuses what this host or daemon cannot run, with the reason.
func (vf *vmFlags) check() error {
	switch vf.runtime {
	case "ns", "":
		return nil
	case "vm":
	default:
		return usageErr("--runtime %q: want ns or vm", vf.runtime)
	}
	if _, err := parseSize(vf.memory); err != nil {
		return usageErr("--memory: %v", err)
	}
	if vf.cpus < 1 {
		return usageErr("--cpus %d: want at least 1", vf.cpus)
	}
	p := vm.Probe()
	if p.Support != vm.Native {
		return fmt.Errorf("vm sandboxes cannot run on this host (%s): %s; use --runtime ns", p.Support, p.Detail)
	}
	return fmt.Errorf("this daemon runs ns sandboxes only: the vm runtime (package sandbox/vm) is not yet one a daemon picks per sandbox; use --runtime ns")
}
