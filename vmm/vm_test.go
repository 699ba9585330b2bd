package vmm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

func needKVM(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("/dev/kvm is missing or not usable: %v", err)
	}
	f.Close()
}

func newBare(t testing.TB, memSize uint64, prog []byte, cfg Config) *VM {
	t.Helper()
	needKVM(t)
	cfg.MemSize = memSize
	vm, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() })
	if err := vm.LoadBare(prog); err != nil {
		t.Fatal(err)
	}
	return vm
}

func TestBareHello(t *testing.T) {
	prog := buildGuest(t, `
void main(u64 memsize) {
	puts("hello from a bare guest\n");
	u64 sum = 0;
	for (u64 i = 0; i < 1000000; i++) sum += i ^ (i >> 3);
	report((u32)sum);
	report((u32)(memsize >> 20));
	exit(7);
}`)
	var console bytes.Buffer
	vm := newBare(t, 16<<20, prog, Config{Console: &console})
	if err := vm.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := console.String(); got != "hello from a bare guest\n" {
		t.Errorf("console = %q", got)
	}
	var want uint64
	for i := uint64(0); i < 1000000; i++ {
		want += i ^ (i >> 3)
	}
	r := vm.Reports()
	if len(r) != 2 || r[0] != uint32(want) || r[1] != 16 {
		t.Errorf("reports = %v, want [%d 16]", r, uint32(want))
	}
	if vm.ExitCode() != 7 {
		t.Errorf("exit code %d, want 7", vm.ExitCode())
	}
}

func TestCloseStopsRun(t *testing.T) {
	prog := buildGuest(t, `void main(u64 m) { for (;;) __asm__ volatile(""); }`)
	vm := newBare(t, 4<<20, prog, Config{})
	done := make(chan error, 1)
	go func() { done <- vm.Run(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	if err := vm.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Run = %v, want ErrClosed", err)
	}
	if err := vm.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
}
