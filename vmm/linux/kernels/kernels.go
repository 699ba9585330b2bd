// Package kernels locates the Linux kernel files that `make kernels` puts
// in the repository's cache: Debian's cloud kernel as a bzImage, the
// vmlinux cut out of it, and the KVM and tun modules the nested harness
// loads.
package kernels

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// EnvDir names the environment variable that overrides the cache
// directory.
const EnvDir = "TINE_KERNEL_DIR"

// RelDir is the cache directory relative to the repository root.
const RelDir = "testdata/cache/kernel"

// Set is one kernel's files, as absolute paths.
type Set struct {
	Dir       string
	Package   string // Debian package the files came from
	Vmlinuz   string // bzImage
	Vmlinux   string // uncompressed ELF, for PVH
	Config    string // the kernel's .config
	Irqbypass string // irqbypass.ko
	KVM       string // kvm.ko
	KVMAMD    string // kvm-amd.ko
	// Tun is tun.ko, for TAP devices in the nested harness's L1 (the vm
	// runtime's networks); empty when the cache was filled before it was
	// fetched, and L1 then has no /dev/net/tun.
	Tun string
}

// ErrMissing is returned (wrapped) when the cache has not been filled.
var ErrMissing = errors.New("kernel files missing (run `make kernels`)")

// Find returns the kernel files from $TINE_KERNEL_DIR or, without it, from
// testdata/cache/kernel under the repository root found by walking up from
// the working directory to go.mod.
func Find() (*Set, error) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return nil, err
		}
		dir = filepath.Join(root, RelDir)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("kernel directory %s: %w", dir, err)
	}
	s := &Set{
		Dir:       dir,
		Vmlinuz:   filepath.Join(dir, "vmlinuz"),
		Vmlinux:   filepath.Join(dir, "vmlinux"),
		Config:    filepath.Join(dir, "config"),
		Irqbypass: filepath.Join(dir, "irqbypass.ko"),
		KVM:       filepath.Join(dir, "kvm.ko"),
		KVMAMD:    filepath.Join(dir, "kvm-amd.ko"),
		Tun:       filepath.Join(dir, "tun.ko"),
	}
	pkg, err := os.ReadFile(filepath.Join(dir, "PACKAGE"))
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrMissing, filepath.Join(dir, "PACKAGE"))
	}
	// PACKAGE holds the package name, then the recipe's stamp.
	if f := strings.Fields(string(pkg)); len(f) > 0 {
		s.Package = f[0]
	}
	for _, p := range []string{s.Vmlinuz, s.Vmlinux, s.Irqbypass, s.KVM, s.KVMAMD} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%w: %s", ErrMissing, p)
		}
	}
	if _, err := os.Stat(s.Tun); err != nil {
		s.Tun = ""
	}
	return s, nil
}

// repoRoot walks up from the working directory to the directory holding
// go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: no go.mod above the working directory", ErrMissing)
		}
		dir = parent
	}
}
