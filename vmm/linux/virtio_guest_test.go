package linux

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"tine/chunkstore"
	"tine/guestagent"
	"tine/internal/syncbuf"
	"tine/vmm/disk"
	"tine/vmm/virtio"
)

// Environment of TestVirtioGuest (set by vmm/nested's
// TestVirtioUnderKVM) and of the guest helper.
const (
	envL2Kernel    = "TINE_L2_KERNEL"
	envL2Initrd    = "TINE_L2_INITRD"
	envGuestHelper = "TINE_GUEST_HELPER"
	guestEchoPort  = 5000
)

// TestVirtioGuest boots Linux with the four virtio devices on a real KVM
// (inside the nested harness): the guest's init loads the virtio modules,
// reads the rng and the disk, writes to hvc0, and serves an echo over
// vsock that the host reaches through the device's Unix socket.
func TestVirtioGuest(t *testing.T) {
	kernelPath, initrdPath := os.Getenv(envL2Kernel), os.Getenv(envL2Initrd)
	if kernelPath == "" {
		t.Skipf("needs a real KVM and a guest: run through vmm/nested's TestVirtioUnderKVM (%s unset)", envL2Kernel)
	}
	kernel, err := os.ReadFile(kernelPath)
	if err != nil {
		t.Fatal(err)
	}
	initrd, err := os.ReadFile(initrdPath)
	if err != nil {
		t.Fatal(err)
	}
	store, err := chunkstore.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	img, err := disk.New(store, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	img.WriteAt([]byte("tine-disk-marker"), 0)
	var serialOut, hvc syncbuf.Buffer
	vs := &virtio.Vsock{GuestCID: 3}
	m, err := NewMachine(context.Background(), MachineConfig{
		Kernel: kernel, Initrd: initrd, MemSize: 256 << 20,
		Cmdline: "console=ttyS0 panic=-1 quiet",
		Console: io.MultiWriter(&serialOut, os.Stdout),
		Virtio:  []virtio.Device{&virtio.RNG{}, &virtio.Console{Output: &hvc}, &virtio.Block{Disk: img, ID: "tine0"}, vs},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sock := filepath.Join(t.TempDir(), "vsock.sock")
	if err := vs.Listen(m.Virtio[3], sock); err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	echo := make(chan string, 1)
	go func() {
		deadline := time.Now().Add(4 * time.Minute)
		for time.Now().Before(deadline) {
			if got, err := vsockEcho(sock); err == nil {
				echo <- got
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
		echo <- "timed out"
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := m.Run(ctx); err != nil {
		t.Fatalf("guest run: %v\nserial:\n%s", err, serialOut.String())
	}
	out := serialOut.String()
	for i, tr := range m.Virtio {
		if err := tr.Err(); err != nil {
			t.Errorf("device %d: %v", i, err)
		}
	}
	if !regexp.MustCompile(`TINE-L2: rng [0-9a-f]{32}`).MatchString(out) || strings.Contains(out, "TINE-L2: rng 00000000000000000000000000000000") {
		t.Errorf("no random bytes from virtio-rng in:\n%s", out)
	}
	if !strings.Contains(out, "TINE-L2: disk tine-disk-marker") {
		t.Errorf("disk marker not read through virtio-blk in:\n%s", out)
	}
	if !strings.Contains(hvc.String(), "hvc-marker") {
		t.Errorf("virtio console got %q", hvc.String())
	}
	b := make([]byte, 16)
	img.ReadAt(b, 4096)
	if string(b) != "written-by-guest" {
		t.Errorf("guest write to the disk: %q", b)
	}
	select {
	case got := <-echo:
		if got != "pong:ping" {
			t.Errorf("vsock echo %q", got)
		}
	default:
		t.Error("no vsock echo before the guest powered off")
	}
}

// vsockEcho connects to the guest's echo port through the device's Unix
// socket and returns the answer to "ping".
func vsockEcho(sock string) (string, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte("CONNECT 5000\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "OK ") {
		return "", io.ErrUnexpectedEOF
	}
	c.Write([]byte("ping"))
	b, err := io.ReadAll(r)
	return string(b), err
}

// TestGuestHelper is the guest side of TestVirtioGuest, run by the L2
// init: one vsock echo with the agent's vsock listener.
func TestGuestHelper(t *testing.T) {
	if os.Getenv(envGuestHelper) == "" {
		t.Skip("runs inside the guest of TestVirtioGuest")
	}
	l, err := guestagent.ListenVsock(guestEchoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if cmdline, _ := os.ReadFile("/proc/cmdline"); strings.Contains(string(cmdline), "tine.fork") {
		guestServer(t, l)
		return
	}
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	c.Write(append([]byte("pong:"), b...))
	c.Close()
}
