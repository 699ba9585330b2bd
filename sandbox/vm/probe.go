package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Support is how this host can run vm sandboxes.
type Support string

const (
	// Native: /dev/kvm with hardware virtualization (VMX or SVM).
	Native Support = "native"
	// NestedOnly: no usable KVM for Linux guests here (none, or PVM,
	// where guest kernel code is emulated), but QEMU can run the nested
	// harness, where KVM is real and slow (docs/nested.md).
	NestedOnly Support = "nested only"
	// None: neither.
	None Support = "not at all"
)

// ProbeResult says how the host can run vm sandboxes, and why.
type ProbeResult struct {
	Support Support `json:"support"`
	// Detail names what was found and, when not native, what is missing.
	Detail string `json:"detail"`
}

// Probe looks at /dev/kvm, the CPU flags and the KVM modules, and for
// QEMU on PATH. It changes nothing.
func Probe() ProbeResult { return probeAt("/") }

func probeAt(root string) ProbeResult {
	p := func(s string) string { return filepath.Join(root, s) }
	_, kvmErr := os.Stat(p("dev/kvm"))
	cpuinfo, _ := os.ReadFile(p("proc/cpuinfo"))
	hw := false
	for _, l := range strings.Split(string(cpuinfo), "\n") {
		if strings.HasPrefix(l, "flags") {
			f := " " + l + " "
			hw = strings.Contains(f, " vmx ") || strings.Contains(f, " svm ")
			break
		}
	}
	_, pvmErr := os.Stat(p("sys/module/kvm_pvm"))
	pvm := pvmErr == nil
	var why []string
	switch {
	case kvmErr == nil && hw && !pvm:
		return ProbeResult{Support: Native, Detail: "/dev/kvm with hardware virtualization"}
	case kvmErr != nil:
		why = append(why, "no /dev/kvm")
	case pvm:
		why = append(why, "/dev/kvm is PVM: a Linux guest's kernel code is emulated, it boots only to its banner")
	default:
		why = append(why, "/dev/kvm without VMX or SVM in the CPU flags")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		return ProbeResult{Support: NestedOnly, Detail: strings.Join(why, "; ") + "; the nested harness (QEMU TCG with SVM) can run it, slowly"}
	}
	why = append(why, "no qemu-system-x86_64 for the nested harness (Debian package qemu-system-x86)")
	return ProbeResult{Support: None, Detail: strings.Join(why, "; ")}
}
