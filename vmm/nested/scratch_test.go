package nested

import (
	"context"
	"os"
	"testing"

	"tine/vmm/linux/kernels"
)

func TestScratchPairs(t *testing.T) {
	if os.Getenv("SCRATCH") == "" {
		t.Skip("scratch")
	}
	k, _ := kernels.Find()
	script := `for i in 1 2 3 4 5 6; do
for f in vmlinuz vmlinux; do
echo "== run $i $f"
timeout -s INT 100 /bin/tine vm boot --kernel l2/$f --initrd l2/init.cpio.gz --mem 256M --cmdline "console=ttyS0 panic=-1 quiet nokaslr"
echo "== run $i $f rc=$?"
done
done
`
	res, err := Run(context.Background(), Options{Script: script, Log: t.Logf, Timeout: 25 * 60e9,
		Files: []File{{Path: "l2/vmlinux", HostPath: k.Vmlinux}, {Path: "l2/vmlinuz", HostPath: k.Vmlinuz}, {Path: "l2/init.cpio.gz", Data: l2Initramfs(t, "/bin/busybox")}}})
	t.Log(err, res.ExitCode)
}
