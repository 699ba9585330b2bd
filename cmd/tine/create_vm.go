package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"tine/sandbox/vm"
)

// vmFlags are create's flags that choose the runtime of a sandbox. A vm
// sandbox is sized by the limits flags: --memory is its guest memory,
// --cpus its vCPUs (limits.go).
type vmFlags struct {
	runtime, kernel string
}

func (vf *vmFlags) flags(f *pflag.FlagSet) {
	f.StringVar(&vf.runtime, "runtime", "ns", "runtime of the sandbox: ns (namespaces) or vm (a Linux VM, see docs/sandboxes.md)")
	f.StringVar(&vf.kernel, "kernel", "", "vm runtime: the guest kernel (default: Debian's cloud kernel from `make kernels`)")
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
	p := vm.Probe()
	if p.Support != vm.Native {
		return fmt.Errorf("vm sandboxes cannot run on this host (%s): %s; use --runtime ns", p.Support, p.Detail)
	}
	return fmt.Errorf("this daemon runs ns sandboxes only: the vm runtime (package sandbox/vm) is not yet one a daemon picks per sandbox; use --runtime ns")
}
