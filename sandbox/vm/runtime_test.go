package vm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/sandbox"
)

// TestInitramfs: the archive unpacks with cpio into the guest's tree:
// the agent as /init, the modules and their order.
func TestInitramfs(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("needs cpio (Debian package cpio)")
	}
	var a initramfs
	a.file("init", 0o755, []byte("agent"))
	a.file("lib/modules/tine/order", 0o644, []byte("virtio\n"))
	a.dir("proc")
	dir := t.TempDir()
	cmd := exec.Command("cpio", "-idm", "--quiet")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(a.bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "init"))
	st, _ := os.Stat(filepath.Join(dir, "init"))
	if err != nil || string(b) != "agent" || st.Mode().Perm() != 0o755 {
		t.Fatalf("init: %q %v %v", b, err, st)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "lib/modules/tine/order")); string(b) != "virtio\n" {
		t.Fatalf("order: %q", b)
	}
	if st, err := os.Stat(filepath.Join(dir, "proc")); err != nil || !st.IsDir() {
		t.Fatalf("proc: %v", err)
	}
}

// TestNewNamesWhatIsMissing: a runtime without a kernel, agent or module
// says which and how to get it.
func TestNewNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "vmlinux")
	ag := filepath.Join(dir, "agent")
	_, err := New(Config{Kernel: k, Agent: ag, StoreDir: filepath.Join(dir, "store")})
	if err == nil || !strings.Contains(err.Error(), "make kernels") {
		t.Fatalf("no kernel: %v", err)
	}
	os.WriteFile(k, []byte("kernel"), 0o644)
	_, err = New(Config{Kernel: k, Agent: ag, StoreDir: filepath.Join(dir, "store")})
	if err == nil || !strings.Contains(err.Error(), "guest agent") {
		t.Fatalf("no agent: %v", err)
	}
	os.WriteFile(ag, []byte("agent"), 0o755)
	_, err = New(Config{Kernel: k, Agent: ag, StoreDir: filepath.Join(dir, "store")})
	if err == nil || !strings.Contains(err.Error(), "virtio_ring") {
		t.Fatalf("no modules: %v", err)
	}
}

// TestCopyStateOfStoppedState: a stopped sandbox's state (its disk root)
// copies as it is; a target that exists is refused; a state naming a
// memory image this process does not hold fails to start with a reason.
func TestCopyStateOfStoppedState(t *testing.T) {
	dir := t.TempDir()
	for _, m := range VirtioModules {
		os.WriteFile(filepath.Join(dir, m+".ko"), []byte("m"), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "vmlinux"), []byte("k"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent"), []byte("a"), 0o755)
	r, err := New(Config{Kernel: filepath.Join(dir, "vmlinux"), Agent: filepath.Join(dir, "agent"), StoreDir: filepath.Join(dir, "store")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	from := filepath.Join(dir, "a")
	want := manifest{Disk: strings.Repeat("ab", 32), Image: "0011223344556677"}
	if err := writeManifest(from, want); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(dir, "b")
	if err := r.CopyState(ctx, from, to); err != nil {
		t.Fatal(err)
	}
	if got, err := readManifest(to); err != nil || got != want {
		t.Fatalf("copied %+v %v, want %+v", got, err, want)
	}
	if err := r.CopyState(ctx, from, to); err == nil {
		t.Fatal("copy onto an existing state succeeded")
	}
	_, err = r.Start(ctx, sandbox.Spec{Dir: filepath.Join(dir, "c"), Seed: from})
	if err == nil || !strings.Contains(err.Error(), "memory image") {
		t.Fatalf("start from an image this process does not hold: %v", err)
	}
}
