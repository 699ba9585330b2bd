package nested

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tine/vmm/linux/kernels"
)

func TestArchiveExtractsWithCpio(t *testing.T) {
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio (Debian package cpio) is not installed")
	}
	var a Archive
	a.File("bin/hello", 0o755, []byte("#!/bin/sh\necho hi\n"))
	a.File("/etc/odd", 0o600, []byte("123")) // 3 bytes: data needs padding
	a.File("empty", 0o644, nil)
	a.Dir("var/empty/dir")
	a.Symlink("bin/sh", "busybox")
	raw, err := a.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if len(raw)%4 != 0 {
		t.Fatalf("archive length %d is not 4-byte aligned", len(raw))
	}
	dir := t.TempDir()
	cmd := exec.Command(cpio, "-id", "--quiet")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(string(raw))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -id: %v\n%s", err, out)
	}
	tests := []struct {
		path string
		mode os.FileMode
		data string
	}{
		{"bin/hello", 0o755, "#!/bin/sh\necho hi\n"},
		{"etc/odd", 0o600, "123"},
		{"empty", 0o644, ""},
	}
	for _, tc := range tests {
		fi, err := os.Stat(filepath.Join(dir, tc.path))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(dir, tc.path))
		if fi.Mode().Perm() != tc.mode || string(b) != tc.data {
			t.Errorf("%s: mode %v data %q, want %v %q", tc.path, fi.Mode().Perm(), b, tc.mode, tc.data)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "var/empty/dir")); err != nil || !fi.IsDir() {
		t.Errorf("var/empty/dir: %v", err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q (%v), want busybox", target, err)
	}
}

func TestArchiveRejectsDuplicates(t *testing.T) {
	var a Archive
	a.File("x", 0o644, []byte("1"))
	a.File("./x", 0o644, []byte("2"))
	if _, err := a.Bytes(); err == nil || !strings.Contains(err.Error(), `"x" added twice`) {
		t.Fatalf("error %v, want a duplicate error", err)
	}
}

func TestScriptOutput(t *testing.T) {
	tests := []struct {
		name, console, out string
		code               int
		finished           bool
	}{
		{"ok", "boot\n" + markerBegin + "\nhello\n" + markerExit + "0\n", "hello\n", 0, true},
		{"failed", markerBegin + "\noops\n" + markerExit + "3\r\n", "oops\n", 3, true},
		{"cut off", markerBegin + "\nhalf", "half", -1, false},
		{"never began", "kernel panic\n", "", -1, false},
		{"garbled status", markerBegin + "\nx\n" + markerExit + "zz\n", "x\n", -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, code, fin := scriptOutput(tc.console)
			if out != tc.out || code != tc.code || fin != tc.finished {
				t.Fatalf("got (%q, %d, %v), want (%q, %d, %v)", out, code, fin, tc.out, tc.code, tc.finished)
			}
		})
	}
}

// l2Marker is what the L2 guest's /init prints.
const l2Marker = "TINE-L2: init reached"

// l2Init prints l2Marker with the kernel release and CPU count; with
// tine.input on the command line it also reads a line from the console
// and prints it back. Then it powers off.
const l2Init = `#!/bin/busybox sh
export PATH=/bin
/bin/busybox mount -t proc proc /proc
/bin/busybox echo "` + l2Marker + `" on $(/bin/busybox uname -r) with $(/bin/busybox nproc) CPUs
if /bin/busybox grep -q tine.input /proc/cmdline; then
	/bin/busybox stty -echo
	read -t 120 line && /bin/busybox echo "TINE-L2: read <$line>"
fi
/bin/busybox poweroff -f
`

// l2Initramfs is a tiny initramfs whose /init prints l2Marker and powers
// the machine off (through ACPI S5, which ends tine's Run).
func l2Initramfs(t *testing.T, busybox string) []byte {
	t.Helper()
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	var a Archive
	a.File("bin/busybox", 0o755, bb)
	a.Dir("dev")
	a.Dir("proc")
	a.File("init", 0o755, []byte(l2Init))
	gz, err := a.Gzip()
	if err != nil {
		t.Fatal(err)
	}
	return gz
}

// TestL1Stall: the lines by which L1's kernel reports a stalled CPU (seen
// when QEMU's emulated CPU stopped answering) end a nested run at once;
// other kernel warnings do not.
func TestL1Stall(t *testing.T) {
	for line, want := range map[string]bool{
		"[   48.725289] watchdog: BUG: soft lockup - CPU#1 stuck for 26s! [tine:103]":    true,
		"[   42.361524] rcu: INFO: rcu_preempt self-detected stall on CPU":               true,
		"[   18.000000] kvm [101]: vcpu0, guest rIP: 0xffffffff81073744 Unhandled WRMSR": false,
		"TINE-L2: init reached on 6.1.0-57-cloud-amd64 with 1 CPUs":                      false,
	} {
		if got := l1Stall(line); got != want {
			t.Errorf("l1Stall(%q) = %v, want %v", line, got, want)
		}
	}
}

// TestL2BootsToInit boots QEMU with emulated SVM (L1), loads kvm-amd in it,
// and has tine's VMM boot Debian's kernel as L2 from inside, by both entry
// paths and with two vCPUs, until L2's /init runs and sees its CPUs; the
// last boot also types a line into L2's serial console.
func TestL2BootsToInit(t *testing.T) {
	if err := Check(); err != nil {
		t.Skipf("%v", err)
	}
	k, err := kernels.Find()
	if err != nil {
		t.Skipf("%v", err)
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox-static is not installed")
	}
	script := `set -e
boot() {
	echo "== L2 $1"
	timeout 240 /bin/tine vm boot --kernel l2/$2 --initrd l2/init.cpio.gz --mem 256M --cpus $3 --cmdline "console=ttyS0 panic=-1 quiet"
	echo "== L2 $1 done"
}
boot bzImage vmlinuz 1
boot pvh vmlinux 1
boot smp vmlinuz 2
echo "== L2 input"
(while :; do echo typed-into-com1; sleep 1; done) | timeout 240 /bin/tine vm boot --input --kernel l2/vmlinuz --initrd l2/init.cpio.gz --mem 256M --cmdline "console=ttyS0 panic=-1 quiet tine.input"
echo "== L2 input done"
`
	out := RunTest(context.Background(), t, Options{
		Script: script,
		Files: []File{
			{Path: "l2/vmlinuz", HostPath: k.Vmlinuz},
			{Path: "l2/vmlinux", HostPath: k.Vmlinux},
			{Path: "l2/init.cpio.gz", Data: l2Initramfs(t, bb)},
		},
	})
	for _, tc := range []struct{ name, want string }{
		{"bzImage", " with 1 CPUs"},
		{"pvh", " with 1 CPUs"},
		{"smp", " with 2 CPUs"},
		{"input", "TINE-L2: read <typed-into-com1>"},
	} {
		_, section, _ := strings.Cut(out, "== L2 "+tc.name+"\n")
		section, _, done := strings.Cut(section, "== L2 "+tc.name+" done")
		if !done || !strings.Contains(section, l2Marker) {
			t.Errorf("L2 %s did not reach /init; its console:\n%s", tc.name, section)
		} else if !strings.Contains(section, tc.want) {
			t.Errorf("L2 %s: /init did not see%s; its console:\n%s", tc.name, tc.want, section)
		}
	}
}

// TestScriptStatus checks that the harness reports a failing script with
// its status and output, and that L1 really has /dev/kvm.
func TestScriptStatus(t *testing.T) {
	if os.Getenv(EnvEnable) == "" {
		t.Skipf("nested QEMU runs take minutes: set %s=1 (make nested-test) to run them", EnvEnable)
	}
	if err := Check(); err != nil {
		t.Skipf("%v", err)
	}
	res, err := Run(context.Background(), Options{
		Script: "test -c /dev/kvm && echo kvm-is-a-char-device; cat note.txt; exit 3\n",
		Files:  []File{{Path: "note.txt", Data: []byte("file-from-host\n")}},
		Log:    t.Logf,
	})
	if err == nil || !strings.Contains(err.Error(), "status 3") {
		t.Fatalf("error %v, want the script's status 3", err)
	}
	if res.ExitCode != 3 || !strings.Contains(res.Output, "kvm-is-a-char-device") || !strings.Contains(res.Output, "file-from-host") {
		t.Fatalf("exit code %d, output %q", res.ExitCode, res.Output)
	}
}

// TestSilentL1IsStalled: a run whose console prints nothing for
// Options.Silence ends then, as stalled (which RunTest runs again once),
// instead of waiting out its whole timeout.
func TestSilentL1IsStalled(t *testing.T) {
	if os.Getenv(EnvEnable) == "" {
		t.Skipf("nested QEMU runs take minutes: set %s=1 (make nested-test) to run them", EnvEnable)
	}
	if err := Check(); err != nil {
		t.Skipf("%v", err)
	}
	start := time.Now()
	_, err := Run(context.Background(), Options{Script: "sleep 600", Silence: 20 * time.Second, Timeout: 5 * time.Minute, Log: t.Logf})
	if !errors.Is(err, ErrL1Stalled) || !strings.Contains(err.Error(), "printed nothing for 20s") {
		t.Fatalf("a silent run: %v, want ErrL1Stalled for its silence", err)
	}
	if d := time.Since(start); d > 2*time.Minute {
		t.Errorf("the silent run ended after %v, not soon after 20s of silence", d)
	}
}
