package guestagent

import (
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestVsockListener: the agent's vsock listener accepts a loopback
// connection and carries bytes both ways. Needs the vsock loopback
// transport (vsock_loopback).
func TestVsockListener(t *testing.T) {
	l, err := ListenVsock(0x7100)
	if err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENODEV) {
			t.Skipf("no AF_VSOCK here: %v", err)
		}
		t.Fatal(err)
	}
	defer l.Close()
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_LOCAL, Port: 0x7100}); err != nil {
		unix.Close(fd)
		t.Skipf("no vsock loopback transport: %v", err)
	}
	client := os.NewFile(uintptr(fd), "client")
	defer client.Close()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client.Write([]byte("ping"))
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("read %q, %v", b, err)
	}
	if !strings.HasPrefix(c.RemoteAddr().String(), "vsock:") {
		t.Fatalf("remote address %v", c.RemoteAddr())
	}
}

// TestHygieneGeneration: the generation counter is published and
// replaced atomically, and host entropy is accepted by the kernel pool
// (the wall clock is not touched here: it is the host's).
func TestHygieneGeneration(t *testing.T) {
	root := t.TempDir()
	ent := make([]byte, 64)
	rand.Read(ent)
	for gen := uint64(1); gen <= 2; gen++ {
		if err := ApplyHygiene(root, Hygiene{Entropy: ent, Generation: gen}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, GenerationFile))
		if err != nil || strings.TrimSpace(string(b)) != string(rune('0'+gen)) {
			t.Fatalf("generation file %q, %v", b, err)
		}
	}
}
