package linux

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// watcher collects console output and closes seen when it first contains
// the marker.
type watcher struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	marker string
	seen   chan struct{}
	once   sync.Once
}

func newWatcher(marker string) *watcher {
	return &watcher{marker: marker, seen: make(chan struct{})}
}

func (w *watcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if bytes.Contains(w.buf.Bytes(), []byte(w.marker)) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func needKVM(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("/dev/kvm is missing or not usable: %v", err)
	}
	f.Close()
}

// TestBootBanner boots Debian's cloud kernel (the vmlinux, through PVH) on
// this host's /dev/kvm until the serial console shows the "Linux version"
// banner, then stops it. That far, a kernel runs even where guest CPL0 is
// emulated (PVM). The bzImage path is left to the nested test: its
// decompressor alone takes minutes at emulated CPL0.
func TestBootBanner(t *testing.T) {
	needKVM(t)
	_, elf := debianKernel(t)
	for _, tc := range []struct {
		name   string
		kernel []byte
	}{
		{"pvh", elf},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
			defer cancel()
			w := newWatcher("Linux version")
			m, err := NewMachine(ctx, MachineConfig{
				Kernel:  tc.kernel,
				Cmdline: "console=ttyS0 earlycon=uart8250,io,0x3f8,115200 nokaslr panic=-1",
				MemSize: 256 << 20,
				Console: w,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx) }()
			select {
			case <-w.seen:
				t.Logf("%s: banner after %v", tc.name, time.Since(start).Round(time.Millisecond))
				cancel()
				<-done
			case err := <-done:
				t.Fatalf("guest ended before its banner: %v\nconsole:\n%s", err, w.String())
			case <-ctx.Done():
				<-done
				t.Fatalf("no banner within the timeout\nconsole:\n%s", w.String())
			}
			if line, _, _ := strings.Cut(w.String()[strings.Index(w.String(), "Linux version"):], "\n"); line != "" {
				t.Logf("%s", line)
			}
		})
	}
}

func TestMachineRejects(t *testing.T) {
	needKVM(t)
	ctx := context.Background()
	tests := []struct {
		name   string
		cfg    MachineConfig
		errHas string
	}{
		{"bad image", MachineConfig{Kernel: []byte("not a kernel"), MemSize: 16 << 20}, "bad kernel image"},
		{"too much RAM", MachineConfig{Kernel: bzHeader(4096), MemSize: 4 << 30}, "at most"},
		{"too many CPUs", MachineConfig{Kernel: bzHeader(4096), VCPUs: 65}, "vCPUs"},
		{"overlapping port", MachineConfig{Kernel: bzHeader(4096), MemSize: 16 << 20, Ports: []PortRange{{0x3fc, 8, emptyBus{}}}}, "overlaps"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMachine(ctx, tc.cfg)
			if err == nil {
				m.Close()
				t.Fatal("created, want an error")
			}
			if !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("error %q, want one containing %q", err, tc.errHas)
			}
		})
	}
	if _, err := NewMachine(ctx, MachineConfig{Kernel: []byte("x"), MemSize: 16 << 20}); !errors.Is(err, ErrBadImage) {
		t.Fatalf("error %v does not wrap ErrBadImage", err)
	}
}
