package nested

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// virtioModules are loaded by the L2 init, in dependency order.
var virtioModules = []string{"virtio_ring", "virtio", "virtio_mmio", "virtio-rng", "virtio_console", "virtio_blk",
	"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport"}

const virtioInit = `#!/bin/busybox sh
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
ip link set lo up
for m in ` + "MODULES" + `; do insmod /lib/modules/$m.ko || echo "TINE-L2: insmod $m failed"; done
for i in 1 2 3 4 5 6 7 8 9 10; do [ -e /dev/vda ] && [ -e /dev/hvc0 ] && break; sleep 1; done
ls /sys/bus/virtio/devices/ | tr '\n' ' '; echo
echo "TINE-L2: rng $(dd if=/dev/hwrng bs=16 count=1 2>/dev/null | od -An -tx1 | tr -d ' \n')"
echo "TINE-L2: disk $(dd if=/dev/vda bs=16 count=1 2>/dev/null)"
printf written-by-guest | dd of=/dev/vda bs=512 seek=8 conv=sync 2>/dev/null
sync
echo hvc-marker > /dev/hvc0
TINE_GUEST_HELPER=1 /guest.test -test.run '^TestGuestHelper$' -test.v
poweroff -f
`

// TestVirtioUnderKVM runs vmm/linux's TestVirtioGuest and
// TestVirtioGuestFork in L1: Debian's kernel as L2 with virtio rng,
// console, block and vsock devices on virtio-mmio, found through the
// DSDT; then a running guest forked into 3 clones (fork hygiene).
func TestVirtioUnderKVM(t *testing.T) {
	if os.Getenv(EnvEnable) == "" {
		t.Skipf("nested QEMU runs take minutes: set %s=1 (make nested-test) to run them", EnvEnable)
	}
	p, err := prerequisites(nil)
	if err != nil {
		t.Skipf("%v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "linux.test")
	build := exec.Command(p.goTool, "test", "-c", "-o", bin, "tine/vmm/linux")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c tine/vmm/linux: %v\n%s", err, out)
	}
	test, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile(p.busybox)
	if err != nil {
		t.Fatal(err)
	}
	var a Archive
	a.File("bin/busybox", 0o755, bb)
	a.Dir("dev")
	a.Dir("proc")
	a.Dir("sys")
	a.File("init", 0o755, []byte(strings.Replace(virtioInit, "MODULES", strings.Join(virtioModules, " "), 1)))
	a.File("guest.test", 0o755, test)
	for _, m := range virtioModules {
		b, err := os.ReadFile(filepath.Join(p.k.Dir, m+".ko"))
		if err != nil {
			t.Skipf("kernel module %s missing (run `make kernels`): %v", m, err)
		}
		a.File("lib/modules/"+m+".ko", 0o644, b)
	}
	initrd, err := a.Gzip()
	if err != nil {
		t.Fatal(err)
	}
	script := rerunFailed("./linux.test -test.run '^TestVirtioGuest(Fork)?$' -test.v -test.timeout 5m", "./linux.test", "3m")
	script = "export TINE_L2_KERNEL=/work/l2/vmlinux TINE_L2_INITRD=/work/l2/init.cpio.gz\n" + script
	out := RunTest(context.Background(), t, Options{Script: script, Files: []File{
		{Path: "linux.test", HostPath: bin, Mode: 0o755},
		{Path: "l2/vmlinux", HostPath: p.k.Vmlinux},
		{Path: "l2/init.cpio.gz", Data: initrd},
	}, Timeout: 9 * time.Minute})
	checkL1(t, out, []string{"TestVirtioGuest", "TestVirtioGuestFork"})
}
