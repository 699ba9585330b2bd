package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/pflag"

	"tine/sandbox"
	"tine/sandbox/vm"
)

// EnvVM sets serve's --vm default: auto, on or off.
const EnvVM = "TINE_VM"

// vmServe are serve's flags for the vm runtime, which the daemon runs
// beside ns when this host can run it.
type vmServe struct {
	mode, kernel, modules, busybox, memory string
	cpus                                   int
}

func (v *vmServe) flags(f *pflag.FlagSet) {
	mode := os.Getenv(EnvVM)
	if mode == "" {
		mode = "auto"
	}
	f.StringVar(&v.mode, "vm", mode, "vm runtime: auto (run it where the host has hardware KVM), on (wherever /dev/kvm is, e.g. inside the nested harness), off; default from $"+EnvVM)
	f.StringVar(&v.kernel, "vm-kernel", os.Getenv("TINE_VM_KERNEL"), "vm runtime: the guest kernel (vmlinux or bzImage, as `make kernels` fetches; default $TINE_VM_KERNEL)")
	f.StringVar(&v.modules, "vm-modules", "", "vm runtime: directory of the guest's virtio modules (default: the kernel's directory)")
	f.StringVar(&v.busybox, "vm-busybox", "", "vm runtime: a static busybox for the guest's /bin (default: busybox on $PATH when static)")
	f.StringVar(&v.memory, "vm-memory", "512M", "vm runtime: a guest's memory where create gives no --memory (at most 3G)")
	f.IntVar(&v.cpus, "vm-cpus", 1, "vm runtime: a guest's vCPUs where create gives no --cpus")
}

// wanted says whether the daemon should run the vm runtime here, and if
// not, why.
func (v *vmServe) wanted() (bool, string) {
	p := vm.Probe()
	switch v.mode {
	case "off":
		return false, "--vm off"
	case "on":
		if _, err := os.Stat("/dev/kvm"); err != nil {
			return false, "--vm on, but " + err.Error()
		}
		return true, ""
	case "auto", "":
		if p.Support != vm.Native {
			return false, fmt.Sprintf("this host runs vm sandboxes %s (%s)", p.Support, p.Detail)
		}
		return true, ""
	}
	return false, fmt.Sprintf("--vm %q: want auto, on or off", v.mode)
}

// runtimes returns the vm runtime to register beside ns, or none, saying
// why on w.
func (v *vmServe) runtimes(root string, w io.Writer) []sandbox.Runtime {
	ok, why := v.wanted()
	if !ok {
		if v.mode == "on" || v.kernel != "" {
			fmt.Fprintf(w, "tine serve: no vm runtime: %s\n", why)
		}
		return nil
	}
	r, err := v.runtime(root)
	if err != nil {
		fmt.Fprintf(w, "tine serve: no vm runtime: %v\n", err)
		return nil
	}
	return []sandbox.Runtime{r}
}

func (v *vmServe) runtime(root string) (*vm.Runtime, error) {
	if v.kernel == "" {
		return nil, fmt.Errorf("no guest kernel: give --vm-kernel or $TINE_VM_KERNEL (`make kernels` fetches Debian's)")
	}
	mem, err := parseSize(v.memory)
	if err != nil {
		return nil, fmt.Errorf("--vm-memory: %w", err)
	}
	if root, err = filepath.Abs(root); err != nil {
		return nil, err
	}
	agent, err := findAgent()
	if err != nil {
		return nil, err
	}
	bb := v.busybox
	if bb == "" {
		if p, err := exec.LookPath("busybox"); err == nil && staticCheck(p) == nil {
			bb = p
		}
	}
	return vm.New(vm.Config{Kernel: v.kernel, Modules: v.modules, Agent: agent, Busybox: bb,
		MemSize: uint64(mem), CPUs: v.cpus, StoreDir: filepath.Join(root, "vm-store")})
}
