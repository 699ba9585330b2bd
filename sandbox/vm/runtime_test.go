package vm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tine/chunkstore"
	"tine/sandbox"
	"tine/vmm"
	"tine/vmm/disk"
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

// fakeRuntime makes a runtime over stand-in kernel, agent and modules
// (enough for everything but starting a machine) with its store in dir.
func fakeRuntime(t *testing.T, dir string) *Runtime {
	t.Helper()
	for _, m := range VirtioModules {
		os.WriteFile(filepath.Join(dir, m+".ko"), []byte("m"), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "vmlinux"), []byte("k"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent"), []byte("a"), 0o755)
	r, err := New(Config{Kernel: filepath.Join(dir, "vmlinux"), Agent: filepath.Join(dir, "agent"), StoreDir: filepath.Join(dir, "store")})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCopyStateOfStoppedState: a stopped sandbox's state (its disk root)
// copies as it is; a target that exists is refused; a state whose memory
// image is damaged fails to start, naming the file.
func TestCopyStateOfStoppedState(t *testing.T) {
	dir := t.TempDir()
	r := fakeRuntime(t, dir)
	defer r.Close()
	ctx := context.Background()
	d, err := disk.New(r.store, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	root, err := d.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(dir, "a")
	want := manifest{Disk: root.String()}
	if err := r.writeState(from, func(string) (manifest, error) { return want, nil }); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(dir, "b")
	// A temporary directory left by a copy cut short is replaced.
	stale := filepath.Join(dir, ".tmp-b")
	os.MkdirAll(filepath.Join(stale, imageDir), 0o700)
	os.WriteFile(filepath.Join(stale, manifestName), []byte("{half"), 0o600)
	if err := r.CopyState(ctx, from, to); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("temporary directory left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(to, imageDir)); !os.IsNotExist(err) {
		t.Fatalf("the stale temporary's image came along: %v", err)
	}
	if got, err := readManifest(to); err != nil || got != want {
		t.Fatalf("copied %+v %v, want %+v", got, err, want)
	}
	if err := r.CopyState(ctx, from, to); err == nil {
		t.Fatal("copy onto an existing state succeeded")
	}
	img := filepath.Join(dir, "img")
	err = r.writeState(img, func(tmp string) (manifest, error) {
		os.Mkdir(filepath.Join(tmp, imageDir), 0o700)
		os.WriteFile(filepath.Join(tmp, imageDir, vmm.ImageMemoryFile), make([]byte, 4096), 0o600)
		os.WriteFile(filepath.Join(tmp, imageDir, vmm.ImageMachineFile), []byte("TINEIMG\x01 but not a machine file at all, damaged"), 0o600)
		return manifest{Disk: root.String(), Image: true}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Start(ctx, sandbox.Spec{Dir: filepath.Join(dir, "c"), Seed: img})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "c", imageDir, vmm.ImageMachineFile)) {
		t.Fatalf("start from a damaged image: %v", err)
	}
	if st, err := os.Stat(filepath.Join(dir, "c", imageDir, vmm.ImageMemoryFile)); err != nil || st.Size() != 4096 {
		t.Fatalf("the copy holds no image: %v", err)
	}
}

// TestStateKeepsDiskFromGC: a chunk-store GC (tine store gc) run while
// no runtime holds the store keeps the disk of every state directory;
// once a directory is gone, the next runtime drops its ref and a GC
// frees its disk.
func TestStateKeepsDiskFromGC(t *testing.T) {
	dir := t.TempDir()
	r := fakeRuntime(t, dir)
	d, err := disk.New(r.store, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	d.WriteAt([]byte("kept by its state"), 8192)
	root, err := d.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := r.writeState(a, func(string) (manifest, error) { return manifest{Disk: root.String()}, nil }); err != nil {
		t.Fatal(err)
	}
	if err := r.CopyState(context.Background(), a, b); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	gc := func() *chunkstore.Store {
		s, err := chunkstore.Open(filepath.Join(dir, "store"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.GC(context.Background()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := gc()
	d2, err := disk.Open(s, root)
	if err != nil {
		t.Fatalf("disk of a state directory after GC: %v", err)
	}
	buf := make([]byte, 17)
	d2.ReadAt(buf, 8192)
	if string(buf) != "kept by its state" {
		t.Fatalf("disk after GC reads %q", buf)
	}
	d2.Close()
	s.Close()
	os.RemoveAll(a)
	fakeRuntime(t, dir).Close() // prunes a's ref; b still holds the disk
	s = gc()
	if !s.Has(root) {
		t.Fatal("GC deleted a disk that state directory b names")
	}
	s.Close()
	os.RemoveAll(b)
	fakeRuntime(t, dir).Close()
	s = gc()
	defer s.Close()
	if s.Has(root) {
		t.Fatal("the disk of removed state directories survived a GC")
	}
	if refs, _ := s.ListRefs(refPrefix); len(refs) != 0 {
		t.Fatalf("refs left: %v", refs)
	}
}

// TestGuestSize: the runtime's defaults fill what a sandbox leaves out;
// sizes the VMM cannot place are refused with the reason.
func TestGuestSize(t *testing.T) {
	r := fakeRuntime(t, t.TempDir())
	defer r.Close()
	g, err := r.GuestSize(nil)
	if err != nil || g.MemoryBytes != 512<<20 || g.CPUs != 1 {
		t.Fatalf("default size %+v %v", g, err)
	}
	g, err = r.GuestSize(&sandbox.GuestSize{MemoryBytes: 2 << 30, CPUs: 2})
	if err != nil || g.MemoryBytes != 2<<30 || g.CPUs != 2 {
		t.Fatalf("2G, 2 vCPUs: %+v %v", g, err)
	}
	for _, tc := range []struct {
		want sandbox.GuestSize
		why  string
	}{
		{sandbox.GuestSize{MemoryBytes: 4 << 30}, "device hole"},
		{sandbox.GuestSize{MemoryBytes: 64 << 20}, "at least"},
		{sandbox.GuestSize{MemoryBytes: 200<<20 + 1}, "4 KiB"},
		{sandbox.GuestSize{CPUs: 65}, "vCPUs"},
		{sandbox.GuestSize{CPUs: -1}, "vCPUs"},
	} {
		if _, err := r.GuestSize(&tc.want); err == nil || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%+v: %v, want %q", tc.want, err, tc.why)
		}
	}
}
