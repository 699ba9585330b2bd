package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVMRunSnapshotRestore(t *testing.T) {
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		t.Skipf("/dev/kvm is missing or not usable: %v", err)
	} else {
		f.Close()
	}
	store := filepath.Join(t.TempDir(), "store")
	want := "hello from a tine bare guest\n"
	cases := []struct {
		args []string
		out  []string
	}{
		{[]string{"vm", "run"}, []string{want, "0\n1\n2\n3\n"}},
		{[]string{"vm", "run", "--store", store, "--ref", "vm/demo"}, []string{want, "snapshot ", "0\n1\n2\n3\n"}},
		{[]string{"vm", "restore", "--store", store, "--ref", "vm/demo"}, []string{"0\n1\n2\n3\n"}},
		{[]string{"vm", "restore", "--lazy", "--store", store, "--ref", "vm/demo"}, []string{"0\n1\n2\n3\n"}},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		if code := run(c.args, &out, &errOut); code != 0 {
			t.Fatalf("tine %s: exit %d: %s", strings.Join(c.args, " "), code, errOut.String())
		}
		for _, w := range c.out {
			if !strings.Contains(out.String(), w) {
				t.Errorf("tine %s: output lacks %q:\n%s", strings.Join(c.args, " "), w, out.String())
			}
		}
		if strings.HasPrefix(c.args[1], "restore") && strings.Contains(out.String(), "hello") {
			t.Errorf("restore ran the guest from the start:\n%s", out.String())
		}
	}
}

// TestVMRunRefusesHostileFork runs a guest that asks for 1000 children:
// the request is refused, the guest gets -1 in RAX (its exit code here),
// and the command says why instead of failing or making them.
func TestVMRunRefusesHostileFork(t *testing.T) {
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		t.Skipf("/dev/kvm is missing or not usable: %v", err)
	} else {
		f.Close()
	}
	guest := []byte{
		0x66, 0xba, 0x03, 0x05, // mov dx, PortFork
		0xb8, 0xe8, 0x03, 0x00, 0x00, // mov eax, 1000
		0xef,                   // out dx, eax
		0x66, 0xba, 0x04, 0x05, // mov dx, PortExit
		0xef,       // out dx, eax: exit with what the fork returned
		0xeb, 0xfe, // jmp $
	}
	prog := filepath.Join(t.TempDir(), "fork1000.bin")
	if err := os.WriteFile(prog, guest, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"vm", "run", prog}, &out, &errOut); code != 0 {
		t.Fatalf("tine vm run: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"VM 0: request refused: fork of 1000 children", "VM 0 exited with code -1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
