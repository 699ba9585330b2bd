package main

import (
	"fmt"
	"math"
	"os"

	"github.com/spf13/pflag"

	"tine/api"
	"tine/sandbox"
	"tine/sandbox/vm"
)

// vmFlags are create's flags that choose the runtime. A vm guest's
// kernel is the daemon's (tine serve --vm-kernel); its memory and vCPUs
// are create's --memory and --cpus (limits.go defines them: for an ns
// sandbox they are cgroup limits), with the daemon's --vm-memory and
// --vm-cpus as defaults.
type vmFlags struct {
	runtime string
}

func (vf *vmFlags) flags(f *pflag.FlagSet) {
	f.StringVar(&vf.runtime, "runtime", "ns", "runtime of the sandbox: ns (namespaces) or vm (a Linux VM whose RAM and vCPUs are --memory and --cpus: see docs/sandboxes.md)")
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

// guest moves --memory and --cpus, which apply put in req's limits, into
// the guest size of a vm sandbox.
func (vf *vmFlags) guest(req *api.CreateRequest) error {
	if vf.runtime != "vm" {
		return nil
	}
	l := &req.Limits
	if l.MemoryBytes == 0 && l.CPUs == 0 {
		return nil
	}
	g := &sandbox.GuestSize{MemoryBytes: l.MemoryBytes}
	if l.CPUs != 0 {
		if l.CPUs != math.Trunc(l.CPUs) || l.CPUs < 1 {
			return usageErr("--cpus %g: a vm sandbox's vCPUs are a whole number, 1 or more", l.CPUs)
		}
		g.CPUs = int(l.CPUs)
	}
	l.MemoryBytes, l.CPUs = 0, 0
	req.Guest = g
	return nil
}
