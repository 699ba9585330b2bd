package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"tine/internal/nsinit"
)

// VMModules is the directory of the vm runtime's initramfs holding the
// kernel modules the agent loads at boot, in the order its file "order"
// names them (virtio transport, devices, vsock).
const VMModules = "/lib/modules/tine"

// vmInit readies a VM guest whose pid 1 is the agent: the kernel's
// filesystems, the virtio and vsock modules, and the loopback interface.
func vmInit() error {
	for _, m := range []struct{ src, dst, typ string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/run", "tmpfs"}, {"tmpfs", "/tmp", "tmpfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, 0, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("vm init: mount %s on %s: %w", m.typ, m.dst, err)
		}
	}
	order, err := os.ReadFile(filepath.Join(VMModules, "order"))
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("vm init: %w", err)
	}
	for _, name := range strings.Fields(string(order)) {
		if err := loadModule(filepath.Join(VMModules, filepath.Base(name)+".ko")); err != nil {
			return err
		}
	}
	if _, err := os.Stat("/bin/busybox"); err == nil {
		// The guest's shell and tools, when the runtime shipped them.
		if out, err := exec.Command("/bin/busybox", "--install", "-s", "/bin").CombinedOutput(); err != nil {
			return fmt.Errorf("vm init: busybox --install: %v: %s", err, out)
		}
	}
	if err := nsinit.LoopbackUp(); err != nil {
		return fmt.Errorf("vm init: %w", err)
	}
	return nil
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("vm init: module: %w", err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && err != unix.EEXIST {
		return fmt.Errorf("vm init: load module %s: %w", path, err)
	}
	return nil
}
